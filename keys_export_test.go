package weir

// SpeakKeyFormat makes a node started with cc speak bucket-key formats up
// to f only: f = 1 stands for a node that predates key formats.
func SpeakKeyFormat(cc *ClusterConfig, f uint32) { cc.keyFormat = f }
