// Package nodeops is the passage between a weir.Node and the operator's
// views of it (package ops): package weir registers, once, how to reach a
// node's operator data, and package ops asks for it. The data does not
// pass through exported methods of weir.Node, which keeps the node's API
// to what a gateway calls.
//
// The passage is typed as any because package weir cannot be named here
// (weir imports this package): weir registers a function from *weir.Node
// to a value of its own unexported type, and ops asserts that value to the
// interface it declares. ops's tests cover the assertion.
package nodeops

// of maps a *weir.Node to its operator data; set once by package weir's
// init, before any node exists.
var of func(node any) any

// Register sets how a node's operator data is reached. Package weir calls
// it from its init; a second call panics.
func Register(f func(node any) any) {
	if of != nil {
		panic("nodeops: Register called twice")
	}
	of = f
}

// Of returns the operator data of node, a *weir.Node.
func Of(node any) any { return of(node) }
