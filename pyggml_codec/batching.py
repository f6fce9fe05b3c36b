"""Many exact streams at once: :class:`BatchStreamDecoder` advances independent streams in one
graph per step, and :func:`decode_batch` decodes several code arrays together.

A batched step is the stream decoder's graph (``streaming.py``) built for B streams of n
frames each: the streams lie in turn along time, so every matrix product reads its weights
once for all of them, and only the ops that mix time (causal convs, conv-transposes,
attention) keep the streams apart, each with its own carried state (``graphs/convs.py``,
``graphs/transformer.py``, ``ops.Carry.batch``). The batch is a graph dimension on every
backend; nothing loops over streams but the host's stacking of their states.

Each stream keeps its own state on the host between steps, so streams join and leave
freely, and a push may give each stream a different number of frames: streams with the same
count share a graph, one graph per distinct count. A push is all or nothing: every stream's
codes are checked before anything runs, and state is committed only after every graph of
the step has run, so a bad push (or a failed compute) leaves every stream as it was.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .engine import Engine
from .errors import InputError
from .inputs import check_codes, check_count, check_invalid_policy
from .stream_state import StreamSlot


class BatchStreamDecoder:
    """Exact decoders for up to ``max_streams`` streams, advanced together.

    ``sid = bsd.join()`` starts a stream; ``bsd.push({sid: codes, ...})`` decodes each
    stream's codes ``(n_codebooks, n_sid)`` (any n >= 1 per stream) and returns
    ``{sid: audio}`` of exactly ``n_sid * samples_per_frame`` samples each; ``bsd.leave(sid)``
    ends it. Each stream's audio equals a :class:`~pyggml_codec.streaming.StreamDecoder` (and
    so a one-shot decode) of its own codes, to float rounding. Errors are
    :class:`InputError`\\ s naming the stream, raised before any stream moves.
    """

    def __init__(self, engine: Engine, max_streams: int = 8, *, on_invalid_codes: str = "clamp",
                 fused: bool = False, owner: object = None):
        if engine.check_open().parts == "encode":
            raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
        if isinstance(max_streams, bool) or not isinstance(max_streams, (int, np.integer)) or max_streams < 1:
            raise ValueError(f"max_streams must be an int >= 1, got {max_streams!r}")
        self._engine = engine
        self._owner = owner  # the Codec that made it, kept alive while the decoder is
        self.max_streams = int(max_streams)
        self.on_invalid_codes = check_invalid_policy(on_invalid_codes)
        self.fused = fused
        self._states = engine.new_streams(self.max_streams)  # every stream's carried state, owned here
        self._slots: dict[int, StreamSlot] = {}
        self._left: set[int] = set()
        self._next_id = 0
        self.last_compute_s = 0.0  # seconds inside ggml compute during the last push
        self.last_groups: list[tuple[int, int]] = []  # (frames, streams) of each graph of the last push

    @property
    def streams(self) -> tuple[int, ...]:
        """The ids of the live streams, in joining order."""
        return tuple(self._slots)

    def frames(self, sid: int) -> int:
        """Frames decoded so far on stream ``sid``."""
        return self._slot(sid).frames

    def join(self) -> int:
        """Start a stream (zero state, position 0) and return its id."""
        if len(self._slots) >= self.max_streams:
            raise InputError(f"this decoder serves at most {self.max_streams} streams at once "
                             f"({len(self._slots)} live); leave one first")
        sid = self._next_id
        self._next_id += 1
        self._slots[sid] = self._states.new_slot()
        return sid

    def leave(self, sid: int) -> None:
        """End stream ``sid`` and drop its state; its id is never reused."""
        self._states.free_slot(self._slot(sid))
        del self._slots[sid]
        self._left.add(sid)

    def _slot(self, sid) -> StreamSlot:
        valid = isinstance(sid, (int, np.integer)) and not isinstance(sid, bool)  # True would be stream 1
        if valid and sid in self._left:
            raise InputError(f"stream {sid} has left this decoder")
        slot = self._slots.get(sid) if valid else None
        if slot is None:
            raise InputError(f"no stream {sid!r} in this decoder (live: {list(self._slots)})")
        return slot

    def push(self, chunks: Mapping[int, object]) -> dict[int, np.ndarray]:
        """Decode one step: ``{sid: codes (n_codebooks, n)}`` -> ``{sid: float32 audio}``."""
        engine = self._engine
        with engine.lock:
            engine.check_open()
            checked: dict[int, np.ndarray] = {}
            for sid, codes in chunks.items():
                self._slot(sid)
                try:
                    checked[sid] = check_codes(codes, engine.config, self.on_invalid_codes, too_long=(
                        "the {max} frames one step takes; push the rest in later steps"))
                except InputError as exc:
                    raise InputError(f"stream {sid}: {exc}") from exc
            groups: dict[int, list[int]] = {}
            for sid, codes in checked.items():
                groups.setdefault(codes.shape[1], []).append(sid)
            self.last_compute_s = 0.0
            self.last_groups = [(n, len(sids)) for n, sids in groups.items()]
            pending: dict[int, list] = {}
            audio: dict[int, np.ndarray] = {}
            for n, sids in groups.items():
                pcm, updates = self._step(n, [self._slots[s] for s in sids], [checked[s] for s in sids])
                audio.update(zip(sids, pcm))
                pending.update(zip(sids, updates))
            for sid, updates in pending.items():  # every graph ran: commit
                self._states.commit(self._slots[sid], updates, checked[sid].shape[1])
        return {sid: audio[sid] for sid in checked}

    def _step(self, n: int, slots: list[StreamSlot], codes: list[np.ndarray]) -> tuple[list[np.ndarray], list]:
        """One group's graphs: each stream's audio and pending state updates."""
        audio, pending, compute_s = self._engine.decode_step(self._states, slots, np.concatenate(codes, axis=1),
                                                             self.fused)
        self.last_compute_s += compute_s
        return np.split(audio.reshape(-1), len(slots)), pending

    def close(self) -> None:
        """End every stream and give their key/value rows back to the engine, for the next new
        streams (a later join starts again)."""
        for sid in list(self._slots):
            self.leave(sid)
        with self._engine.lock:  # not while a push on another thread still computes on the rows
            self._states.close()

    def __enter__(self) -> "BatchStreamDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def decode_batch(engine: Engine, items: Sequence, *, on_invalid_codes: str = "clamp",
                 frames_per_step: int | None = None, fused: bool = False) -> list[np.ndarray]:
    """Decode several code arrays ``(n_codebooks, T_i)`` together: a list of float32 audio,
    ``T_i * samples_per_frame`` samples each, equal to decoding each alone (float rounding).

    All items advance in one graph per step, each by ``min(frames left of any item,
    frames_per_step // items left)`` frames; ``frames_per_step`` (default: the codec's
    ``decode_chunk_frames``, or unbounded where that is None, as on GPU backends) bounds the
    step's compute buffer, as ``decode_chunk_frames`` bounds one decode's.
    """
    cfg = engine.check_open().config
    checked = []
    for i, codes in enumerate(items):
        try:
            checked.append(check_codes(codes, cfg, on_invalid_codes, max_frames=None))
        except InputError as exc:
            raise InputError(f"item {i}: {exc}") from exc
    budget = engine.chunk_frames() if frames_per_step is None else check_count(frames_per_step, "frames_per_step", 1)
    pieces: list[list[np.ndarray]] = [[] for _ in checked]
    if not checked:
        return []
    with BatchStreamDecoder(engine, max_streams=len(checked), fused=fused) as bsd:
        sids = {bsd.join(): i for i in range(len(checked))}
        done = [0] * len(checked)
        while sids:
            left = min(checked[i].shape[1] - done[i] for i in sids.values())
            n = left if budget is None else max(1, min(left, budget // len(sids)))
            out = bsd.push({sid: checked[i][:, done[i]:done[i] + n] for sid, i in sids.items()})
            for sid, pcm in out.items():
                i = sids[sid]
                pieces[i].append(pcm)
                done[i] += n
                if done[i] == checked[i].shape[1]:
                    bsd.leave(sid)
                    del sids[sid]
    return [np.concatenate(p) for p in pieces]
