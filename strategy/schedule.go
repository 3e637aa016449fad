package strategy

import "fmt"

// Schedule is a pipeline schedule (Pipeline.Schedule).
type Schedule uint8

const (
	// OneFOneB is 1F1B (Megatron-LM's forward_backward_pipelining_without_
	// interleaving, or _with_interleaving when Pipeline.Interleave > 1):
	// the zero value.
	OneFOneB Schedule = iota
	// GPipe runs all forwards, then all backwards.
	GPipe
)

var scheduleNames = [...]string{OneFOneB: "1f1b", GPipe: "gpipe"}

func (s Schedule) String() string {
	if int(s) < len(scheduleNames) {
		return scheduleNames[s]
	}
	return fmt.Sprintf("schedule(%d)", uint8(s))
}

// ParseSchedule reads "1f1b" (or "") and "gpipe".
func ParseSchedule(name string) (Schedule, error) {
	switch name {
	case "", "1f1b":
		return OneFOneB, nil
	case "gpipe":
		return GPipe, nil
	}
	return 0, fmt.Errorf("unknown pipeline schedule %q (want 1f1b or gpipe)", name)
}
