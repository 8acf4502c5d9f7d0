"""A harness sample's answer as a Trace: by token where the log has logprobs (the tokens and their top-2
logprobs as the server reported them), by text units where it has none (text_units.py; logprobs unknown,
NaN, so no near-tie is claimed and risk is left empty). Token ids are run-local, one per distinct token
byte string (flakecheck.probe.vocab), shared by every log of the run so their tokens compare."""

from __future__ import annotations

import math

from flakecheck.data.traces import Trace
from flakecheck.harness.model import SampleRun
from flakecheck.harness.text_units import text_units
from flakecheck.probe.level_runner import trace_from_answer
from flakecheck.probe.parse import Answer, TokenRef
from flakecheck.probe.vocab import MISSING, Vocab

UNKNOWN = math.nan


def sample_trace(sample: SampleRun, composition: str, repeat: int, vocab: Vocab, by_token: bool) -> Trace:
    if by_token:
        assert sample.steps is not None
        answer = Answer(sample.output, sample.steps, sample.finish_reason, None, None)
        return trace_from_answer(sample.sample_id, composition, repeat, answer, vocab)
    ids = [vocab.id_of(TokenRef(None, unit, unit.encode("utf-8"))) for unit in text_units(sample.output)]
    n = len(ids)
    return Trace(sample.sample_id, composition, repeat, ids, list(ids), [UNKNOWN] * n, [MISSING] * n,
                 [UNKNOWN] * n, sample.finish_reason)
