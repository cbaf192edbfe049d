package weir

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/cluster/shell"
	"github.com/weir-dev/weir/internal/hitters"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/quota"
)

// Bucket key formats: how a rule's bucket key is derived from the identity
// its key chain yields (docs/security.md, "Identity namespaces"; the switch
// between them in docs/operations.md).
const (
	// keyFormatShared: every source of a chain counts under its bare value,
	// so an X-Api-Key header equal to a client's IP spends that IP's
	// bucket. Nodes that predate key formats speak only this one.
	keyFormatShared uint32 = 1
	// keyFormatNamespaced: each source of a chain is a namespace. The
	// chain's first source keeps the bare value (its buckets, overrides,
	// lookups and descriptor keys are format 1's); a later source's
	// identities get a salt of their own in this node's keys and a tag
	// before the value where the identity leaves the node (the cluster's
	// owner, the lease group's durable counters).
	keyFormatNamespaced uint32 = 2
	// keyFormatLatest is the highest format this build speaks.
	keyFormatLatest = keyFormatNamespaced
)

// Tags of namespaced identities where they leave the node. A later source's
// identity is sourceTagPrefix + the source ("ip", "user", "header:X-User") +
// NUL + the value; a first-source value that itself begins with NUL is
// escaped as nulEscape + the value. A tagged or escaped identity longer than
// the cluster's identity limit (cluster.MaxIdentityBytes, which a value
// within Config.MaxIdentityBytes's default fits but its tag may not) is
// digestPrefix + the hex SHA-256 of the tag and value instead. Nothing
// else begins with NUL, so no value of one source can be read as another's.
const (
	sourceTagPrefix = "\x00src\x00"
	nulEscape       = "\x00\x00"
	digestPrefix    = "\x00sha256\x00"
)

// keyForm is a compiled rule's per-source keying: salts[i] and tags[i] for
// the identities its key chain's source i yields under keyFormatNamespaced
// (salts[0] is the rule's own salt and tags[0] is empty: the first source
// keeps format 1's keys).
type keyForm struct {
	salts []uint64
	tags  []string
}

// compileKeys fills c.keys from c's rule and salt.
func (n *Node) compileKeys(c *crule) {
	k := len(c.r.Key)
	if k == 0 {
		k = 1
	}
	c.keys.salts = make([]uint64, k)
	c.keys.tags = make([]string, k)
	c.keys.salts[0] = c.salt
	for i := 1; i < len(c.r.Key); i++ {
		label := c.r.Key[i].String()
		c.keys.salts[i] = bucket.Mix(c.salt, n.hasher.Sum("source\x00"+label))
		c.keys.tags[i] = sourceTagPrefix + label + "\x00"
	}
}

// sourceIndex returns the position in c's key chain of an override's
// source (the zero KeySource, quota's form of the first source, is 0), or
// -1 when the chain has no such source.
func (c *crule) sourceIndex(s quota.KeySource) int {
	if s == (quota.KeySource{}) {
		return 0
	}
	for i, k := range c.r.Key {
		if k == s {
			return i
		}
	}
	return -1
}

// namespaced reports whether an identity id of source src needs the
// namespaced form under format: a later source's, or a first-source value
// that begins with NUL (escaped, so that it cannot pose as a tag).
func namespaced(format uint32, src int, id string) bool {
	return format >= keyFormatNamespaced && (src > 0 || (len(id) > 0 && id[0] == 0))
}

// namespace moves p, built for identity p.id of source src with format 1's
// key (newPending), to its namespace: a later source's salt for the
// node's own key, and the tagged identity (and its hash) where the
// identity leaves the node. Call it only when namespaced says so.
func (n *Node) namespace(p *pending, src int) {
	if src > 0 {
		p.key = bucket.Mix(p.c.keys.salts[src], p.idh)
	}
	if p.remote() {
		p.wid = wireIdentity(p.c.keys.tags[src], p.id)
		p.idh = n.hasher.Sum(p.wid)
	}
}

// wireIdentity is the identity an owner or the lease group counts a
// namespaced identity under: tag + value for a later source, the escaped
// value for a first-source value beginning with NUL (tag ""), or, when that
// is longer than the cluster accepts, its digest.
func wireIdentity(tag, id string) string {
	if tag == "" {
		tag = nulEscape
	}
	if len(tag)+len(id) > cluster.MaxIdentityBytes {
		sum := sha256.Sum256([]byte(tag + id))
		return digestPrefix + hex.EncodeToString(sum[:])
	}
	return tag + id
}

// pendingFor returns rule c's part of a request whose identity id came from
// source src of the rule's key chain (0 for the first source, and for
// identities no chain yields: Check's and CheckKeys' keys, the "" of a
// global rule), under the node's key format in force format.
func (n *Node) pendingFor(order int, c *crule, id string, src int, tier string, format uint32, cost int64) pending {
	p := newPending(order, c, c.specFor(id, src, tier), id, n.hasher.Sum(id), cost)
	p.format, p.source = format, uint8(src)
	if namespaced(format, src, id) {
		n.namespace(&p, src)
	}
	return p
}

// overrideSuffix ends the coordinator's rule id of rule c's override of
// identity id in source src: "#override:" + id for the first source (the
// id nodes of every format agree on), "#override@" + the source + ":" + id
// for a later one.
func overrideSuffix(c *crule, src int, id string) string {
	if src == 0 {
		return "#override:" + id
	}
	return "#override@" + c.r.Key[src].String() + ":" + id
}

// noteKeyFormat puts in force the lowest key format that this node and every
// live member of the cluster (of every region: the lease group's durable
// counters and global leases are shared across regions) speak, so that no
// two members name one identity's bucket differently: a mixed fleet keeps
// format 1, and the fleet switches once its last member speaks format 2
// (docs/operations.md, "The bucket key format"). A member that left no
// longer counts.
func (n *Node) noteKeyFormat(members []shell.MemberInfo) {
	f := n.cluster.speaks
	for _, mi := range members {
		f = min(f, uint32(mi.KeyFormat))
	}
	f = max(f, keyFormatShared)
	if old := n.keyFormat.Swap(f); old != f {
		n.log.Info("bucket key format changed", "format", f, "was", old, "members", len(members))
	}
}

// durableKey names p's durable bucket for the lease group: its identity
// under the format it was keyed with and, when that differs from format 1's
// bare value, the bare value, so that the group carries format 1's spend
// over (lease/durable_legacy.go).
func durableKey(p *pending) lease.DurableKey {
	k := lease.DurableKey{Identity: p.wid, KeyFormat: p.format}
	if p.wid != p.id {
		k.Legacy = p.id
	}
	return k
}

// addHitter counts one of p's rejections in a top list under its rule and
// identity, and, for a namespaced identity, the source's tag, so that the
// list tells the API key "x" from the IP "x" (toHitters reads it back).
func (n *Node) addHitter(sk *hitters.Sketch, now int64, p *pending) {
	if !namespaced(p.format, int(p.source), p.id) {
		sk.AddPair(now, p.c.r.ID, p.id, 1)
		return
	}
	tag := p.c.keys.tags[p.source]
	if tag == "" {
		tag = nulEscape
	}
	sk.AddTriple(now, p.c.r.ID, tag, p.id, 1)
}

// splitTagged reads an identity as addHitter writes it: the source's name
// ("" for the first source) and the value.
func splitTagged(id string) (source, value string) {
	if rest, ok := strings.CutPrefix(id, sourceTagPrefix); ok {
		if label, v, ok := strings.Cut(rest, "\x00"); ok {
			return label, v
		}
	}
	if v, ok := strings.CutPrefix(id, nulEscape); ok {
		return "", v
	}
	return "", id
}
