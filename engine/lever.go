package engine

// LargestLever plans Compare's strategies on base (its own training
// semantics kept) and returns the one that lowers the peak the most: the
// next step a job that does not fit is pointed to. nil when no strategy
// applies or none lowers the peak.
func LargestLever(base Spec) (*Row, error) {
	rows, err := Compare(base, Allow{})
	if err != nil {
		return nil, err
	}
	basePeak := rows[0].Result.PeakBytes()
	var best *Row
	for i := 1; i < len(rows); i++ {
		r := &rows[i]
		if r.Err != nil || r.Result == nil || r.Result.PeakBytes() >= basePeak {
			continue
		}
		if best == nil || r.Result.PeakBytes() < best.Result.PeakBytes() {
			best = r
		}
	}
	return best, nil
}
