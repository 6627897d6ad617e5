package fleeting_test

import (
	"errors"
	"testing"

	"github.com/berthci/berth/fleeting"
)

func TestStates(t *testing.T) {
	for _, s := range fleeting.States {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if fleeting.State("booting").Valid() {
		t.Error("unknown state valid")
	}
	for s, terminal := range map[fleeting.State]bool{
		fleeting.StateCreating: false, fleeting.StateRunning: false, fleeting.StateDeleting: false,
		fleeting.StateDeleted: true, fleeting.StateTimeout: true,
	} {
		if s.Terminal() != terminal {
			t.Errorf("%s.Terminal() = %v", s, !terminal)
		}
	}
}

func TestPort(t *testing.T) {
	for _, tc := range []struct {
		c    fleeting.ConnectorConfig
		want int
	}{
		{fleeting.ConnectorConfig{}, 22},
		{fleeting.ConnectorConfig{Protocol: fleeting.ProtocolSSH}, 22},
		{fleeting.ConnectorConfig{Protocol: fleeting.ProtocolWinRM}, 5985},
		{fleeting.ConnectorConfig{Protocol: fleeting.ProtocolWinRMHTTPS}, 5986},
		{fleeting.ConnectorConfig{Protocol: fleeting.ProtocolSSH, ProtocolPort: 2222}, 2222},
	} {
		if got := tc.c.Port(); got != tc.want {
			t.Errorf("%+v.Port() = %d, want %d", tc.c, got, tc.want)
		}
	}
}

func TestInstanceError(t *testing.T) {
	err := &fleeting.InstanceError{ID: "i-3", Err: fleeting.ErrInstanceNotFound}
	if err.Error() != "instance i-3: instance not found" || !errors.Is(err, fleeting.ErrInstanceNotFound) {
		t.Fatalf("%v", err)
	}
}
