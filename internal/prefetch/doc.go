// Package prefetch asks the CPU to start loading a cache line before the
// code that reads it runs: a way to overlap a likely cache miss (a random
// slot of a large table) with other work of the same request. It is a hint
// only: nothing any code observes changes, whether or not it is taken.
package prefetch
