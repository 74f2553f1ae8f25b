// Package kernels holds the trainer's dense fp32 compute: matrix products
// (an assembly micro-kernel where the CPU has FMA, a portable Go fallback)
// split over the worker's threads.
package kernels
