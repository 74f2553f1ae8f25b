// Package elastic is the per-node agent: it forms a round with the other
// nodes, starts this node's workers, watches them, stops them all when one
// fails or a signal arrives, and restarts within a budget; with
// Spec.InPlace it keeps live workers across a membership change and tells
// them their new contract instead.
package elastic
