//go:build race

package launch

// raceEnabled: this test binary runs under the race detector, so the
// processes it starts are built with it too.
const raceEnabled = true
