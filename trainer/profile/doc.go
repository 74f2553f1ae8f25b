// Package profile splits each training step's wall time into phases
// (matrix products, attention, elementwise work, optimizer, collectives,
// waiting) with a lap timer cheap enough to run on every step.
package profile
