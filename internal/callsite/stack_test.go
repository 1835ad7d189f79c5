package callsite

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// here returns this file's short name and the line of here's call, as a
// site names it.
func here() string {
	_, file, line, _ := runtime.Caller(1)
	return ShortFile(file) + ":" + strconv.Itoa(line)
}

// siteOfOuter is the method of a package that records where it was called
// from: Capture skips the function that calls it and names its caller.
//
//go:noinline
func siteOfOuter(fast bool) (s Stack) {
	if fast {
		s.CaptureFast() // from here: CaptureFast names the function that calls it
		return s
	}
	s.Capture()
	return s
}

// Capture names the caller of the function calling it, CaptureFast and
// Here the function calling them: none adds a frame of its own, whatever
// the package it lives in.
func TestCaptureSkipsItsCaller(t *testing.T) {
	var s Stack
	if s.Recorded() || s.String() != "unknown" || s.Function() != "" {
		t.Fatalf("zero Stack: recorded %v, %q, %q", s.Recorded(), s.String(), s.Function())
	}
	s, want := siteOfOuter(false), here()
	if !s.Recorded() || s.String() != want {
		t.Errorf("Capture: %q, want %q", s.String(), want)
	}
	if fn := s.Function(); !strings.HasSuffix(fn, ".TestCaptureSkipsItsCaller") {
		t.Errorf("Capture's frame: %s, want the test", fn)
	}
	s = siteOfOuter(true)
	if fn := s.Function(); !strings.HasSuffix(fn, ".siteOfOuter") {
		t.Errorf("CaptureFast's frame: %s, want siteOfOuter (its caller)", fn)
	}
	s.Reset()
	if s.Recorded() || s.String() != "unknown" {
		t.Errorf("after Reset: recorded %v, %q", s.Recorded(), s.String())
	}
	if got, want := Here(), here(); got != want {
		t.Errorf("Here: %q, want %q", got, want)
	}
}

// Names names a stack as String does, and from the second time without
// allocating; it stays bounded by maxNames.
func TestNamesOf(t *testing.T) {
	var names Names
	s := siteOfOuter(true)
	if got, want := names.Of(&s), s.String(); got != want || got == "unknown" {
		t.Fatalf("Names.Of: %q, String: %q", got, want)
	}
	if allocs := testing.AllocsPerRun(100, func() { names.Of(&s) }); allocs != 0 {
		t.Errorf("Names.Of of a known stack: %v allocations, want 0", allocs)
	}
	var none Stack
	if got := names.Of(&none); got != "unknown" {
		t.Errorf("Names.Of(empty stack) = %q, want unknown", got)
	}
	var bogus Stack // return addresses of no function: no user frame
	for pc := uintptr(1); pc <= uintptr(maxNames+len(bogus.pcs)); pc += uintptr(len(bogus.pcs)) {
		for i := range bogus.pcs {
			bogus.pcs[i] = pc + uintptr(i)
		}
		bogus.n = len(bogus.pcs)
		if got := names.Of(&bogus); got != "unknown" {
			t.Fatalf("Names.Of(pcs from %#x) = %q, want unknown", pc, got)
		}
	}
	names.mu.RLock()
	n := len(names.names)
	names.mu.RUnlock()
	if n > maxNames {
		t.Errorf("Names holds %d return addresses, past its bound %d", n, maxNames)
	}
}

// trailOuter records a Trail from a helper of the application.
//
//go:noinline
func trailOuter() (t Trail) {
	t.Capture()
	return t
}

// A Trail names up to three frames of the application, from the caller of
// the function that captured it, without lockhooks', the runtime's and
// testing's frames.
func TestTrailNamesTheApplicationsFrames(t *testing.T) {
	var nilTrail *Trail
	if nilTrail.String() != "unknown" || (&Trail{}).String() != "unknown" {
		t.Fatalf("an empty Trail is not unknown")
	}
	var tr Trail
	site := func() string { var site string; tr, site = trailOuter(), here(); return site }() // the closure's frame and the test's, on one line
	if got, want := tr.String(), site+", called from "+site; got != want {
		t.Errorf("Trail: %q, want %q", got, want)
	}
}
