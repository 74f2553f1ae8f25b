// Package chart draws a metrics file as a picture for people: the loss
// and the tokens per second against the step, with the places where the
// run restarted or its world size changed marked.
package chart
