"""A reference replay of a memplan.trace/v1 document at any batch (and sequence) size.

memplan's Go simulator is the real consumer of traces; this replay exists to check traces against
measurements in the suite and tests. It applies no strategy (no checkpointing, accumulation, offload).
"""

import math


def storage_bytes(s, batch, seq=None):
    b = s["bytes_const"] + s["bytes_per_batch"] * batch
    if seq is not None and "bytes_per_seq" in s:
        b += (s["bytes_per_seq"] * seq + s["bytes_per_seq2"] * seq * seq + s["bytes_per_batch_seq"] * batch * seq
              + s["bytes_per_batch_seq2"] * batch * seq * seq)
    return b


def scratch_bytes(ev, batch, seq=None):
    """In-kernel scratch of an event at `batch` (and `seq`): piecewise linear in the batch through the points
    recorded at each sequence length (two, or three with a point below the fit when batch 1 was asked for), then (with several sequence lengths and a `seq`) the Lagrange
    polynomial through the three largest; never negative. memplan's Go importer
    (importer/torchtrace.ScratchAt) is the same function."""
    sc = ev.get("scratch")
    if not sc:
        return 0
    by_seq = {}
    for b, s, y in sc["points"]:
        by_seq.setdefault(s or 0, []).append((b, y))
    if not by_seq:
        return sc["bytes"]
    seqs = sorted(by_seq)

    def at_batch(pts):
        pts = sorted(pts)
        if len(pts) < 2 or pts[0][0] == pts[-1][0]:
            return float(pts[0][1])
        # piecewise linear through the points, the end segments extended (two points: one line)
        k = 1
        while k < len(pts) - 1 and batch > pts[k][0]:
            k += 1
        (b1, y1), (b2, y2) = pts[k - 1], pts[k]
        return y1 + (y2 - y1) * (batch - b1) / float(b2 - b1)

    if len(seqs) == 1 or not seq:
        y = at_batch(by_seq[seqs[-1]])
    else:
        seqs = seqs[-3:]
        y = 0.0
        for i, si in enumerate(seqs):
            w = 1.0
            for j, sj in enumerate(seqs):
                if i != j:
                    w *= float(seq - sj) / float(si - sj)
            y += w * at_batch(by_seq[si])
    if not y > 0:
        return 0
    return int(math.floor(y + 0.5))


def first_step_created(doc):
    """Ids of the initial storages absent before the first step because its optimizer phase creates them:
    first_step.optimizer_state, and every initial storage first_step.optimizer_events allocates. An optimizer
    that replaces its state each step (m = b*m + g stored back, not updated in place) creates its state under
    ids that are initial in the steady step; traces exported before the exporter labelled them
    optimizer_state list none of them, and counting them live at the start as well as where the first step
    allocates them counted the state twice. memplan's Go importer (torchtrace.FirstStepCreated) is the same
    function."""
    out = set(doc["first_step"]["optimizer_state"])
    initial = {s["id"] for s in doc["initial_storages"]}
    for e in doc["first_step"]["optimizer_events"]:
        out.update(a["id"] for a in e["alloc"] if a["id"] in initial)
    return out


HOLDS = ("none", "backward", "next-forward")


def replay(doc, batch, seq=None, first_step=False, min_bytes=0, scratch=False, hold="none"):
    """Per-phase peak live bytes of the traced step at `batch`.

    Storages smaller than min_bytes are ignored (to compare with an allocator counter with a threshold).
    hold is how long the training loop keeps the model's output (memplan's loop.hold-outputs; needs the
    trace's model_output): "none" as recorded (dropped once the loss exists), "backward" until backward is
    done (`out = model(x); loss = f(out); loss.backward()`), "next-forward" until the next step's model
    returns and rebinds the variable (through the optimizer step; the previous step's output is alive as the
    steady step starts, not as the first one does).
    Returns {"phases": {...}, "peak_bytes", "peak_phase", "baseline_bytes"}."""
    if hold not in HOLDS:
        raise ValueError("memplan_torch: hold must be one of %s, got %r" % (", ".join(HOLDS), hold))
    held, returned_at = set(), -1
    if hold != "none":
        mo = doc.get("model_output")
        if mo is None:
            raise ValueError("memplan_torch: trace %s does not record the model's output (model_output: exported "
                             "before issue 10); re-export it to replay hold=%s" % (doc.get("name"), hold))
        held, returned_at = set(mo["storages"]), mo["returned_at"]
    live = {}
    state = first_step_created(doc) if first_step else set()
    for s in doc["initial_storages"]:
        if s["id"] in state:
            continue
        n = storage_bytes(s, batch, seq)
        if n >= min_bytes:
            live[s["id"]] = n
    cur = sum(live.values())
    sizes = {a["id"]: storage_bytes(a, batch, seq) for e in doc["events"] for a in e["alloc"] if a["id"] in held}
    carried = 0
    if hold == "next-forward" and not first_step:
        carried = sum(n for n in sizes.values() if n >= min_bytes)  # the previous step's output
        cur += carried
    base = cur
    peaks = {}
    events = doc["events"]
    if first_step:
        events = [e for e in events if e["phase"] != "optimizer"] + doc["first_step"]["optimizer_events"]
    last_backward = max((i for i, e in enumerate(events) if e["phase"] != "optimizer"), default=-1)
    for i, e in enumerate(events):
        for a in e["alloc"]:
            n = storage_bytes(a, batch, seq)
            if n >= min_bytes:
                live[a["id"]] = n
                cur += n
        ph = e["phase"]
        top = cur + (scratch_bytes(e, batch, seq) if scratch else 0)
        if top > peaks.get(ph, 0):
            peaks[ph] = top
        for f in e["free"]:
            if f not in held:
                cur -= live.pop(f, 0)
        if i == returned_at:
            cur -= carried  # the variable is rebound to this step's output
            carried = 0
        if i == last_backward and hold == "backward":
            for f in held:
                cur -= live.pop(f, 0)
    peak_phase = max(peaks, key=lambda p: peaks[p]) if peaks else None
    return {"phases": peaks, "peak_bytes": peaks.get(peak_phase, base), "peak_phase": peak_phase,
            "baseline_bytes": base}
