// Package broadcast wakes every waiter at once: a channel that closes at the next change and
// is then replaced by a fresh one (close-and-replace).
package broadcast
