//go:build race

package lockhooks

// raceBuild: the tests run under the race detector, which slows map-heavy
// code about tenfold; tests of scale use smaller sizes.
const raceBuild = true
