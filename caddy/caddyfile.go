package weircaddy

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("weir", parseCaddyfile)
	// After authentication, so that {http.auth.user.id} is known.
	httpcaddyfile.RegisterDirectiveOrder("weir", httpcaddyfile.After, "forward_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	w := new(Handler)
	err := w.UnmarshalCaddyfile(h.Dispenser)
	return w, err
}

// UnmarshalCaddyfile reads the weir directive:
//
//	weir [<id>] {
//		rules <<YAML
//		rules:
//		  - id: per-key
//		    ...
//		YAML
//		rules_file <path>
//		user <placeholder>
//		tier <placeholder>
//		client_ip <placeholder>
//		max_identity_bytes <n>
//		handle_errors
//		cluster {
//			name <name>
//			region <region>
//			gossip <host:port>
//			advertise <host:port>
//			rpc <host:port>
//			join <host:port>...
//			label <label>
//			local_timing
//			key_file <path>...
//			tls <cert> <key> <ca>
//		}
//		lease {
//			voters <host:port>...
//			rules
//			check_interval <duration>
//			tls <cert> <key> <ca>
//		}
//	}
func (w *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		w.ID = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "rules":
			if err := one(d, &w.Rules); err != nil {
				return err
			}
		case "rules_file":
			if err := one(d, &w.RulesFile); err != nil {
				return err
			}
		case "user":
			if err := one(d, &w.User); err != nil {
				return err
			}
		case "tier":
			if err := one(d, &w.Tier); err != nil {
				return err
			}
		case "client_ip":
			if err := one(d, &w.ClientIP); err != nil {
				return err
			}
		case "max_identity_bytes":
			var s string
			if err := one(d, &s); err != nil {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return d.Errf("max_identity_bytes: want a byte count, got %q", s)
			}
			w.MaxIdentityBytes = n
		case "handle_errors":
			if d.NextArg() {
				return d.ArgErr()
			}
			w.HandleErrors = true
		case "cluster":
			c, err := unmarshalCluster(d)
			if err != nil {
				return err
			}
			w.Cluster = c
		case "lease":
			l, err := unmarshalLease(d)
			if err != nil {
				return err
			}
			w.Lease = l
		default:
			return d.Errf("weir: unknown subdirective %q", d.Val())
		}
	}
	return nil
}

func unmarshalCluster(d *caddyfile.Dispenser) (*Cluster, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	c := new(Cluster)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "name":
			err = one(d, &c.Name)
		case "region":
			err = one(d, &c.Region)
		case "gossip":
			err = one(d, &c.Gossip)
		case "advertise":
			err = one(d, &c.Advertise)
		case "rpc":
			err = one(d, &c.RPC)
		case "label":
			err = one(d, &c.Label)
		case "join":
			c.Join = append(c.Join, d.RemainingArgs()...)
		case "key_file":
			c.KeyFiles = append(c.KeyFiles, d.RemainingArgs()...)
		case "local_timing":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			c.LocalTiming = true
		case "tls":
			args := d.RemainingArgs()
			if len(args) != 3 {
				return nil, d.Errf("tls: want <cert> <key> <ca>")
			}
			c.TLS = &TLSFiles{Cert: args[0], Key: args[1], CA: args[2]}
		default:
			return nil, d.Errf("weir cluster: unknown subdirective %q", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

func unmarshalLease(d *caddyfile.Dispenser) (*Lease, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	l := new(Lease)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "voters":
			l.Voters = append(l.Voters, d.RemainingArgs()...)
		case "rules":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			l.Rules = true
		case "check_interval":
			var s string
			if err := one(d, &s); err != nil {
				return nil, err
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil || dur < 0 {
				return nil, d.Errf("lease check_interval: want a duration, got %q", s)
			}
			l.CheckInterval = caddy.Duration(dur)
		case "tls":
			args := d.RemainingArgs()
			if len(args) != 3 {
				return nil, d.Errf("lease tls: want <cert> <key> <ca>")
			}
			l.TLS = &TLSFiles{Cert: args[0], Key: args[1], CA: args[2]}
		default:
			return nil, d.Errf("weir lease: unknown subdirective %q", d.Val())
		}
	}
	return l, nil
}

// one reads a subdirective's single argument into v.
func one(d *caddyfile.Dispenser, v *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*v = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
