package search

import "github.com/memplan/memplan/engine"

// The search groups, memoizes and prunes plans by keys. Each key is the
// plan's Spec with the parts it ignores zeroed, never a list of fields, so
// a field added to engine.Spec splits the groups (safe) until a key
// deliberately ignores it; TestKeysCoverEverySpecField lists, for every
// field, the keys that ignore it and why.

// groupKey is what a group of plans shares: everything but the split of the
// replica's batch into micro-batch × accumulation.
func groupKey(s *engine.Spec) engine.Spec {
	k := *s
	k.MicroBatch, k.Accum = 0, 0
	return k
}

// stateKey is what decides the memory that stays resident: the group but
// its checkpointing, activation offload and optimizer implementation.
func stateKey(s *engine.Spec) engine.Spec {
	k := groupKey(s)
	k.Checkpoint, k.Offload.Activations, k.Impl = engine.CheckpointPolicy{}, false, 0
	return k
}

// bundleKey is what the states of a bundle share: the state but its ZeRO
// stage and model-state (optimizer or parameter) offload.
func bundleKey(s *engine.Spec) engine.Spec {
	k := stateKey(s)
	k.ZeRO, k.Offload = 0, engine.Offload{}
	return k
}

// overKey is what memo.over remembers within a bundle: the group but its
// model-state offload (a state that offloads less is bounded by one that
// offloads more).
func overKey(s *engine.Spec) engine.Spec {
	k := groupKey(s)
	k.Offload.Optimizer, k.Offload.Params = false, false
	return k
}

// hintKey is what memo.hints carries from one state of a bundle to the
// next: the group but its ZeRO stage.
func hintKey(s *engine.Spec) engine.Spec {
	k := groupKey(s)
	k.ZeRO = 0
	return k
}

// stepKey matches a plan with its fused-step twin in one state: the hint
// key but the optimizer implementation.
func stepKey(s *engine.Spec) engine.Spec {
	k := hintKey(s)
	k.Impl = 0
	return k
}
