package explain

import (
	"fmt"

	"github.com/memplan/memplan/units"
)

// DeviceError: the device asked for is not among the snapshot's. The
// command line names the option that chose it (Error's words are the
// package's own).
type DeviceError struct {
	File   string
	Device int64
	Have   []int64
}

func (e *DeviceError) Error() string {
	return fmt.Sprintf("%s: device %d: the snapshot has devices %v", e.File, e.Device, e.Have)
}

// CapacityError: DiagnoseOOM has no out-of-memory to diagnose. With
// Capacity zero the trace records no OOM event and no capacity to replay it
// on was given; otherwise the replay on Capacity bytes fits (the allocator
// model reserves at most Reserved).
type CapacityError struct {
	File               string
	Capacity, Reserved units.Bytes
}

func (e *CapacityError) Error() string {
	if e.Capacity == 0 {
		return fmt.Sprintf("%s: the trace records no out-of-memory event; give a capacity to replay it on a smaller device", e.File)
	}
	return fmt.Sprintf("%s: the run fits in a capacity of %s (the allocator model reserves at most %s of it)", e.File, e.Capacity, e.Reserved)
}
