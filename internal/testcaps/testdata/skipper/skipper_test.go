// Package skipper is run by TestReportShownByGoTest with Chromium hidden
// from PATH: its one test skips the way lockhooks' browser tests do.
package skipper

import (
	"testing"

	"github.com/lockhooks/lockhooks/internal/testcaps"
)

func TestMain(m *testing.M) { testcaps.Main(m) }

func TestNeedsChromium(t *testing.T) {
	testcaps.NeedChromium(t)
	t.Log("Chromium found")
}

func TestNeedsNothing(t *testing.T) {}
