//go:build !race

package lockhooks

// raceBuild: the tests run under the race detector (see race_on_test.go).
const raceBuild = false
