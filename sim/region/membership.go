package region

import (
	"fmt"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/sim/engine"
)

// The membership model stands in for memberlist: each node has its own
// view, which follows the truth (which nodes run and which it can reach)
// after a delay it draws per change: Detect for a node that crashed or
// became unreachable, Gossip for a join, a leave or a healed partition,
// each drawn uniformly in [d/2, d] per observing node, so views converge
// one node at a time and two nodes may briefly disagree on an owner. A view
// change builds a new ring (the node's own epoch counter, as the gateway's
// watchMembers does) and installs it with SetTable.

// pairChange is a pending change of j in i's view.
type pairChange struct {
	want bool
	due  int64
}

// topologyChanged recomputes what every running node should see, and
// schedules view changes for the pairs whose truth changed. leave marks the
// change as announced (a graceful leave spreads by gossip, not detection).
func (rg *Region) topologyChanged(leave bool) {
	now := rg.sim.Now()
	r := rg.sim.Rand()
	for i, ni := range rg.nodes {
		if !ni.up {
			continue
		}
		// One delay per observer and kind of change, drawn in node order.
		gossip := now + drawDelay(r, int64(rg.cfg.Gossip))
		detect := now + drawDelay(r, int64(rg.cfg.Detect))
		for j, nj := range rg.nodes {
			if j == i {
				continue
			}
			want := nj.up && nj.serving && rg.net.Reachable(i, j)
			pc := &rg.pending[i][j]
			if want == pc.want {
				continue
			}
			pc.want = want
			switch {
			case want || leave:
				pc.due = gossip
			default:
				pc.due = detect
			}
			rg.sim.At(pc.due, &viewCheck{n: ni, inc: ni.inc})
		}
	}
}

func drawDelay(r interface{ Int64N(int64) int64 }, d int64) int64 {
	if d <= 1 {
		return d
	}
	return d/2 + r.Int64N(d-d/2+1)
}

// viewCheck applies the due changes of a node's view.
type viewCheck struct {
	n   *node
	inc uint64
}

func (v *viewCheck) Fire(s *engine.Sim) {
	n := v.n
	if !n.up || n.inc != v.inc {
		return
	}
	rg := n.rg
	now := s.Now()
	changed := false
	for j := range rg.nodes {
		if j == n.id {
			continue
		}
		pc := rg.pending[n.id][j]
		if n.member[j] != pc.want && now >= pc.due {
			n.member[j] = pc.want
			changed = true
		}
	}
	if !changed {
		return
	}
	n.epoch++
	ring := rg.tableOf(n, n.epoch)
	n.coord.SetTable(n.now(), ring)
	rg.ringChanges++
	rg.series.rings = append(rg.series.rings, RingChange{At: rg.elapsed(), Node: n.name, Epoch: n.epoch, Members: ring.Len()})
	if rg.cfg.Log != nil {
		fmt.Fprintf(rg.cfg.Log, "%v %s: ring epoch %d, %d members\n", rg.elapsed(), n.name, n.epoch, ring.Len())
	}
	// Shell.SetRing: a peer back in the ring is a new run of that node
	// (Links.SetPeers), what SetTable queued goes at once, and the
	// flusher is kicked.
	n.peers = n.lk.SetPeers(ring.Members(), n.peers[:0])
	for _, peer := range n.peers {
		n.coord.SetPeerDown(0, peer, false)
	}
	n.flush()
	n.kick()
}

// ownerCache is a node's OwnerTable: the real *cluster.Ring, with each
// identity's owner remembered for as long as the ring is in force. The
// coordinator asks for the owner on every decision, and rendezvous hashing
// costs O(members) (about 90 ns at 100); the answers are the ring's own.
// The run's identities are "id-" and an index (Region.ids), so the
// cache is a slice by that index rather than a map keyed by strings.
type ownerCache struct {
	*cluster.Ring
	ids   *idNames // the run's identity names
	owner []string // owner by identity index; "" not yet known
}

// OwnerName returns the ring's owner of identity.
func (o *ownerCache) OwnerName(identity string) string {
	i := o.ids.at(identity)
	if i < 0 {
		var ok bool
		if i, ok = o.ids.parse(identity); !ok {
			return o.Ring.OwnerName(identity)
		}
	}
	if n := o.owner[i]; n != "" {
		return n
	}
	n := o.Ring.OwnerName(identity)
	o.owner[i] = n
	return n
}

var _ cluster.OwnerTable = (*ownerCache)(nil)

// tableOf is node n's OwnerTable for its view. Nodes whose views hold the
// same members share one cache of owners: the same members give the same
// owners.
func (rg *Region) tableOf(n *node, epoch uint64) *ownerCache {
	key := make([]byte, len(n.member))
	for j, in := range n.member {
		if in || j == n.id {
			key[j] = 1
		}
	}
	owners := rg.owners[string(key)]
	if owners == nil {
		if rg.owners == nil {
			rg.owners = map[string][]string{}
		}
		owners = make([]string, len(rg.ids.names))
		rg.owners[string(key)] = owners
	}
	return &ownerCache{Ring: rg.ringOf(n, epoch), ids: rg.ids, owner: owners}
}

// ringOf builds node n's ring from its view.
func (rg *Region) ringOf(n *node, epoch uint64) *cluster.Ring {
	var ms []cluster.Member
	for j, in := range n.member {
		if in || j == n.id {
			ms = append(ms, cluster.Member{Name: rg.names[j], Addr: rg.names[j]})
		}
	}
	ring, err := cluster.NewRing(epoch, ms)
	if err != nil {
		panic(err) // names are unique by construction
	}
	return ring
}
