"""The dispatch loop in front of every engine: FIFO admission at a width, race-safe
cancellation, true in-flight counts. A scripted engine stands in for llama.cpp so each race
can be staged exactly (the engine blocks on a gate between tokens)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from skulk.shared.types.tasks import EmbeddingParams, TextGenerationParams
from skulk.shared.types.workload_io import EmbeddingResult, TranscriptionParams, TranscriptionResult
from skulk.worker.engines.base import (
    Dispatcher,
    DispatchRejected,
    EngineBroken,
    EngineError,
    GeneratedResult,
    GeneratedToken,
    GenerationResult,
    usage_of,
)

pytestmark = pytest.mark.timeout(30)

WAIT_S = 5.0


def wait_until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.002)


def request(name: str, tokens: int = 3) -> TextGenerationParams:
    return TextGenerationParams(model_id="local/fake", prompt=name, max_tokens=tokens)


class Exploding(EngineError):
    error_type = "Exploding"


class Broken(EngineBroken):
    error_type = "Broken"


class ScriptedEngine:
    """Emits `max_tokens` tokens named after the prompt. With `gated`, waits for `step()`
    before each token after the first, so a test can hold a generation mid-stream."""

    def __init__(self, *, gated: bool = False, width: int = 1) -> None:
        self.gated = gated
        self.width = width
        self.started: list[str] = []
        self._running = 0
        self.max_running = 0
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Semaphore] = {}

    @property
    def concurrency(self) -> int:
        return self.width

    @property
    def in_flight(self) -> int:
        return self._running

    def gate(self, name: str) -> threading.Semaphore:
        with self._lock:
            return self._gates.setdefault(name, threading.Semaphore(0))

    def step(self, name: str, n: int = 1) -> None:
        for _ in range(n):
            self.gate(name).release()

    def _wait_for_step(self, name: str, cancelled: threading.Event) -> None:
        # A real engine notices a cancel within one token; this one within 10 ms of waiting.
        deadline = time.monotonic() + WAIT_S
        while not self.gate(name).acquire(timeout=0.01):
            if cancelled.is_set():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} was never stepped")

    def load(self, spec) -> None: ...

    def warm_up(self) -> None: ...

    def close(self) -> None: ...

    def generate(self, req: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        name = req.prompt or ""
        with self._lock:
            self.started.append(name)
            self._running += 1
            self.max_running = max(self.max_running, self._running)
        try:
            if name.startswith("explode"):
                raise Exploding(f"{name} blew up")
            if name.startswith("crash"):
                raise RuntimeError("engine bug")
            if name.startswith("broken"):
                raise Broken(f"node x lost while serving {name}")
            total = req.max_tokens or 1
            for i in range(total):
                if i and self.gated:
                    self._wait_for_step(name, cancelled)
                if cancelled.is_set():
                    return
                last = i == total - 1
                yield GeneratedToken(
                    f"{name}{i}", i, "length" if last else None, usage_of(1, i + 1) if last else None
                )
        finally:
            with self._lock:
                self._running -= 1


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []
        self._lock = threading.Lock()

    def on_start(self, request_id: str) -> None:
        with self._lock:
            self.events.append(("start", request_id, None))

    def on_token(self, request_id: str, token: GeneratedToken) -> None:
        with self._lock:
            self.events.append(("token", request_id, token))

    def on_finish(self, request_id: str, result: GenerationResult) -> None:
        with self._lock:
            self.events.append(("finish", request_id, result))

    def of(self, request_id: str) -> list[tuple[str, object]]:
        with self._lock:
            return [(kind, payload) for kind, rid, payload in self.events if rid == request_id]

    def results(self) -> dict[str, GenerationResult]:
        with self._lock:
            return {rid: payload for kind, rid, payload in self.events if kind == "finish"}  # type: ignore[misc]

    def finish_order(self) -> list[str]:
        with self._lock:
            return [rid for kind, rid, _ in self.events if kind == "finish"]

    def finished(self, request_id: str) -> bool:
        return request_id in self.results()


@pytest.fixture
def make():
    made: list[Dispatcher] = []

    def factory(engine: ScriptedEngine, **kwargs) -> tuple[Dispatcher, RecordingSink]:
        sink = RecordingSink()
        dispatcher = Dispatcher(engine, sink, width=engine.concurrency, **kwargs)
        made.append(dispatcher)
        return dispatcher, sink

    yield factory
    for dispatcher in made:
        dispatcher.close(timeout_s=2)


def test_requests_run_in_admission_order_one_at_a_time(make) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    for name in ("a", "b", "c", "d"):
        dispatcher.submit(name, request(name))
    wait_until(lambda: len(sink.results()) == 4)
    assert engine.started == ["a", "b", "c", "d"]
    assert sink.finish_order() == ["a", "b", "c", "d"]
    assert engine.max_running == 1
    assert [kind for kind, _ in sink.of("b")] == ["start", "token", "token", "token", "finish"]
    result = sink.results()["b"]
    assert (result.outcome, result.finish_reason, result.usage) == ("completed", "length", usage_of(1, 3))
    assert dispatcher.in_flight == 0


def test_width_bounds_concurrent_generations(make) -> None:
    engine = ScriptedEngine(gated=True, width=2)
    dispatcher, sink = make(engine)
    for name in ("a", "b", "c", "d"):
        dispatcher.submit(name, request(name, tokens=2))
    # The two workers take "a" then "b" from the queue, but which of them reaches the engine
    # first is up to the scheduler (with more cores, truly in parallel): the first two
    # admitted run, in either order, and the other two wait.
    wait_until(lambda: sorted(engine.started) == ["a", "b"])
    assert (dispatcher.running, dispatcher.queued, dispatcher.in_flight) == (2, 2, 4)
    for name in ("a", "b", "c", "d"):
        engine.step(name)
    wait_until(lambda: len(sink.results()) == 4)
    assert engine.max_running == 2
    assert sorted(engine.started[:2]) == ["a", "b"] and sorted(engine.started[2:]) == ["c", "d"]


def test_in_flight_counts_queued_and_running_until_finish_is_reported(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, sink = make(engine)
    assert dispatcher.in_flight == 0
    dispatcher.submit("a", request("a", tokens=2))
    dispatcher.submit("b", request("b", tokens=2))
    dispatcher.submit("c", request("c", tokens=2))
    wait_until(lambda: engine.started == ["a"])
    assert (dispatcher.in_flight, dispatcher.running, dispatcher.queued) == (3, 1, 2)
    engine.step("a")
    wait_until(lambda: sink.finished("a"))
    wait_until(lambda: engine.started == ["a", "b"])
    assert (dispatcher.in_flight, dispatcher.running, dispatcher.queued) == (2, 1, 1)
    engine.step("b")
    engine.step("c")
    wait_until(lambda: dispatcher.in_flight == 0)
    stats = dispatcher.stats()
    assert (stats.admitted_total, stats.completed_total, stats.running, stats.queued) == (3, 3, 0, 0)


def test_in_flight_is_already_decremented_when_finish_is_reported(make) -> None:
    engine = ScriptedEngine()
    seen: list[int] = []
    sink = RecordingSink()
    holder: dict[str, Dispatcher] = {}
    original = sink.on_finish

    def on_finish(request_id: str, result: GenerationResult) -> None:
        seen.append(holder["d"].in_flight)
        original(request_id, result)

    sink.on_finish = on_finish  # type: ignore[method-assign]
    dispatcher = Dispatcher(engine, sink, width=1)
    holder["d"] = dispatcher
    try:
        dispatcher.submit("a", request("a"))
        wait_until(lambda: sink.finished("a"))
        assert seen == [0]
    finally:
        dispatcher.close(timeout_s=2)


def test_cancel_before_start_finishes_at_once_and_never_reaches_the_engine(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, sink = make(engine)
    dispatcher.submit("a", request("a"))
    dispatcher.submit("b", request("b"))
    wait_until(lambda: engine.started == ["a"])

    assert dispatcher.cancel("b") is True
    assert sink.of("b") == [("finish", GenerationResult(outcome="cancelled", finish_reason="cancelled"))]
    assert (dispatcher.in_flight, dispatcher.queued) == (1, 0)
    assert dispatcher.cancel("b") is False  # idempotent: already finished

    engine.step("a", 2)
    wait_until(lambda: sink.finished("a"))
    assert engine.started == ["a"]
    assert sink.results()["a"].outcome == "completed"
    assert len(sink.of("b")) == 1


def test_cancel_during_generation_stops_at_the_next_token(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, sink = make(engine)
    dispatcher.submit("a", request("a", tokens=100))
    dispatcher.submit("b", request("b", tokens=1))
    wait_until(lambda: len(sink.of("a")) == 2)  # start + first token

    assert dispatcher.cancel("a") is True
    assert dispatcher.cancel("a") is True  # still in flight until it notices; harmless
    engine.step("a")
    wait_until(lambda: sink.finished("a"))

    events = sink.of("a")
    tokens = [payload for kind, payload in events if kind == "token"]
    assert len(tokens) == 1
    assert events[-1] == ("finish", GenerationResult(outcome="cancelled", finish_reason="cancelled"))
    assert [kind for kind, _ in events].count("finish") == 1
    wait_until(lambda: sink.finished("b"))  # the queue moves on
    assert sink.results()["b"].outcome == "completed"
    assert dispatcher.in_flight == 0


def test_cancel_after_finish_changes_nothing(make) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("a", request("a"))
    wait_until(lambda: sink.finished("a"))
    before = sink.of("a")
    assert dispatcher.cancel("a") is False
    assert dispatcher.cancel("never-submitted") is False
    assert sink.of("a") == before
    assert sink.results()["a"].outcome == "completed"


def test_cancel_arriving_with_the_last_token_keeps_the_completed_outcome(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, sink = make(engine)
    dispatcher.submit("a", request("a", tokens=2))
    wait_until(lambda: len(sink.of("a")) == 2)
    engine.step("a")
    wait_until(lambda: sink.finished("a"))
    dispatcher.cancel("a")
    assert sink.results()["a"].outcome == "completed"


def test_a_finished_id_can_be_submitted_again(make) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("a", request("a"))
    wait_until(lambda: sink.finished("a"))
    dispatcher.submit("a", request("a"))
    wait_until(lambda: sink.finish_order() == ["a", "a"])


def test_duplicate_and_over_capacity_requests_are_refused(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, _sink = make(engine, queue_capacity=1)
    dispatcher.submit("a", request("a"))
    wait_until(lambda: engine.started == ["a"])
    dispatcher.submit("b", request("b"))
    with pytest.raises(DispatchRejected) as duplicate:
        dispatcher.submit("a", request("a"))
    assert duplicate.value.error_type == "DuplicateTask"
    with pytest.raises(DispatchRejected) as full:
        dispatcher.submit("c", request("c"))
    assert full.value.error_type == "RunnerBusy"
    assert dispatcher.in_flight == 2
    assert dispatcher.stats().rejected_total == 2


@pytest.mark.parametrize(
    ("name", "error_type"),
    [("explode", "Exploding"), ("crash", "RuntimeError")],
)
def test_engine_failure_fails_that_request_only(make, name: str, error_type: str) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit(name, request(name))
    dispatcher.submit("after", request("after"))
    wait_until(lambda: len(sink.results()) == 2)
    failed = sink.results()[name]
    assert (failed.outcome, failed.finish_reason, failed.error_type) == ("failed", "error", error_type)
    assert failed.error_message
    assert not failed.fatal  # the runner goes on serving
    assert sink.results()["after"].outcome == "completed"


def test_a_broken_engine_fails_the_request_with_its_reason_and_marks_it_fatal(make) -> None:
    dispatcher, sink = make(ScriptedEngine())
    dispatcher.submit("broken", request("broken"))
    wait_until(lambda: "broken" in sink.results())
    failed = sink.results()["broken"]
    assert (failed.outcome, failed.error_type, failed.fatal) == ("failed", "Broken", True)
    assert failed.error_message == "node x lost while serving broken"


def test_close_fails_everything_in_flight_and_refuses_new_work() -> None:
    engine = ScriptedEngine(gated=True)
    sink = RecordingSink()
    dispatcher = Dispatcher(engine, sink, width=1)
    dispatcher.submit("a", request("a", tokens=100))
    dispatcher.submit("b", request("b"))
    wait_until(lambda: len(sink.of("a")) == 2)

    closer = threading.Thread(target=dispatcher.close, kwargs={"timeout_s": WAIT_S})
    closer.start()
    wait_until(lambda: sink.finished("b"))
    engine.step("a")
    closer.join(WAIT_S)
    assert not closer.is_alive()

    for rid in ("a", "b"):
        result = sink.results()[rid]
        assert (result.outcome, result.error_type) == ("failed", "RunnerShutdown")
    with pytest.raises(DispatchRejected) as refused:
        dispatcher.submit("c", request("c"))
    assert refused.value.error_type == "RunnerShutdown"
    assert dispatcher.in_flight == 0


def test_random_cancel_timing_always_ends_each_request_exactly_once(make) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine, queue_capacity=1000)
    rng = random.Random(7)
    ids = [f"r{i}" for i in range(200)]
    for rid in ids:
        dispatcher.submit(rid, request(rid, tokens=rng.randint(1, 5)))
        if rng.random() < 0.5:
            victim = rng.choice(ids[: ids.index(rid) + 1])
            dispatcher.cancel(victim)
    wait_until(lambda: dispatcher.in_flight == 0)
    assert sorted(sink.finish_order()) == sorted(ids)
    for rid in ids:
        kinds = [kind for kind, _ in sink.of(rid)]
        assert kinds.count("finish") == 1 and kinds[-1] == "finish"
        if sink.results()[rid].outcome == "completed":
            assert kinds[0] == "start"


def test_run_on_worker_runs_on_the_decoding_thread_before_queued_requests(make) -> None:
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    threads: dict[str, str] = {}

    def warm_up() -> None:
        threads["warm_up"] = threading.current_thread().name
        assert sink.events == []  # nothing ran before it

    dispatcher.run_on_worker(warm_up)
    original = engine.generate

    def generate(req, cancelled):
        threads["generate"] = threading.current_thread().name
        return original(req, cancelled)

    engine.generate = generate  # type: ignore[method-assign]
    dispatcher.submit("a", request("a", 1))
    wait_until(lambda: sink.finished("a"))
    assert threads["warm_up"] == threads["generate"] != threading.current_thread().name


def test_run_on_worker_reraises_and_the_dispatcher_still_serves(make) -> None:
    dispatcher, sink = make(ScriptedEngine())

    def broken() -> None:
        raise RuntimeError("no graph")

    with pytest.raises(RuntimeError, match="no graph"):
        dispatcher.run_on_worker(broken)
    dispatcher.submit("a", request("a", 2))
    wait_until(lambda: sink.finished("a"))
    assert sink.results()["a"].outcome == "completed"


def test_run_on_worker_has_a_deadline_and_close_releases_a_waiting_call(make) -> None:
    engine = ScriptedEngine(gated=True)
    dispatcher, _sink = make(engine)
    dispatcher.submit("a", request("a", 3))
    wait_until(lambda: engine.started == ["a"])  # the only worker is busy, held mid-stream
    with pytest.raises(TimeoutError):
        dispatcher.run_on_worker(lambda: None, timeout_s=0.05)

    outcome: dict[str, BaseException | None] = {}

    def call() -> None:
        try:
            dispatcher.run_on_worker(lambda: None, timeout_s=WAIT_S)
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=call)
    waiter.start()
    wait_until(lambda: len(dispatcher._queue) == 2)  # the timed-out call and this one, no requests
    assert dispatcher.queued == 0
    dispatcher.close(timeout_s=2)
    waiter.join(WAIT_S)
    assert isinstance(outcome["error"], DispatchRejected)
    with pytest.raises(DispatchRejected):
        dispatcher.run_on_worker(lambda: None)


class EmbeddingScriptedEngine(ScriptedEngine):
    def embed(self, inputs, dimensions=None):
        return [[float(len(text)), 0.0][: dimensions or 2] for text in inputs], sum(len(t) for t in inputs)


def test_an_embedding_request_yields_one_embedding_then_completes(make) -> None:
    dispatcher, sink = make(EmbeddingScriptedEngine())
    dispatcher.submit("e", EmbeddingParams(model_id="local/fake", inputs=["ab", "abc"], dimensions=1))
    wait_until(lambda: sink.finished("e"))
    kinds = sink.of("e")
    assert [kind for kind, _ in kinds] == ["start", "token", "finish"]
    embedding = kinds[1][1]
    assert isinstance(embedding, GeneratedResult) and embedding.result == EmbeddingResult(embeddings=[[2.0], [3.0]])
    assert embedding.usage == usage_of(5, 0)
    assert sink.results()["e"].outcome == "completed"


def test_an_engine_without_embeddings_refuses_them_typed(make) -> None:
    dispatcher, sink = make(ScriptedEngine())
    dispatcher.submit("e", EmbeddingParams(model_id="local/fake", inputs=["ab"]))
    wait_until(lambda: sink.finished("e"))
    result = sink.results()["e"]
    assert (result.outcome, result.error_type) == ("failed", "WorkloadUnsupported")


@pytest.mark.parametrize(("engine_name", "pipelined", "fields", "refused"), [
    ("vllm", False, {"logprobs": True}, True),
    ("mlx", True, {"logprobs": True}, True),  # a pipeline's last rank samples: plain sampling only
    ("mlx", True, {"logit_bias": {3: 1.0}}, True),
    ("mlx", False, {"logprobs": True, "logit_bias": {3: 1.0}}, False),
    ("llama_cpp", False, {"logprobs": True, "logit_bias": {3: 1.0}}, False),
    (None, False, {"logprobs": True}, False),  # no engine named: no guard (the engine decides)
])
def test_a_feature_the_engine_lacks_is_refused_at_admission(make, engine_name, pipelined, fields, refused) -> None:
    dispatcher, sink = make(ScriptedEngine(), engine_name=engine_name, pipelined=pipelined)
    params = request("a").model_copy(update=fields)
    if refused:
        with pytest.raises(DispatchRejected) as caught:
            dispatcher.submit("a", params)
        assert caught.value.error_type == "FeatureUnsupported" and engine_name in caught.value.message
        assert dispatcher.in_flight == 0
    else:
        dispatcher.submit("a", params)
        wait_until(lambda: sink.finished("a"))


@pytest.mark.parametrize(("engine_name", "pipelined"), [("llama_cpp", True), ("mlx", False), ("vllm", False)])
def test_images_to_an_engine_that_cannot_see_are_refused_by_name(make, engine_name, pipelined) -> None:
    """A pooled llama.cpp instance (a pipeline) does not see; mlx and vllm never do."""
    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.media import IMAGE_MARKER, ImageInput

    dispatcher, _ = make(ScriptedEngine(), engine_name=engine_name, pipelined=pipelined)
    picture = ImageInput.of(b"\x89PNG...", "image/png", 1, 1)
    params = TextGenerationParams(model_id="local/fake", messages=[
        ChatMessage(role="user", content=f"{IMAGE_MARKER}what", images=[picture])])
    with pytest.raises(DispatchRejected) as caught:
        dispatcher.submit("a", params)
    assert caught.value.error_type == "FeatureUnsupported"
    assert engine_name in caught.value.message and "image input" in caught.value.message


@pytest.mark.parametrize(("fields", "refused"), [
    ({"logprobs": True}, True),  # MLX's vision path (mlx-vlm) samples plainly
    ({"logit_bias": {3: 1.0}}, True),
    ({"frequency_penalty": 0.5}, True),
    ({}, False),
])
def test_the_vision_path_refuses_what_it_does_not_honour(make, fields, refused) -> None:
    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.media import IMAGE_MARKER, ImageInput

    dispatcher, sink = make(ScriptedEngine(), engine_name="mlx", vision=True)
    picture = ImageInput.of(b"\x89PNG...", "image/png", 1, 1)
    params = TextGenerationParams(model_id="local/fake", messages=[
        ChatMessage(role="user", content=f"{IMAGE_MARKER}what", images=[picture])]).model_copy(update=fields)
    if refused:
        with pytest.raises(DispatchRejected) as caught:
            dispatcher.submit("a", params)
        assert caught.value.error_type == "FeatureUnsupported" and "mlx" in caught.value.message
    else:
        dispatcher.submit("a", params)  # images are honoured on the vision path
        wait_until(lambda: sink.finished("a"))


class TranscribingScriptedEngine(ScriptedEngine):
    """Transcribes by script: the file name says how many partial results come before the
    final one ('3.wav'), or that none is final ('nofinal.wav'), or that it fails mid-way
    ('explode.wav'). Gated: each result after the first waits for `step(file name)`.
    `closed` lists the requests whose result iterator was closed (the engine stopped)."""

    def __init__(self) -> None:
        super().__init__(gated=True)
        self.closed: list[str] = []

    def transcribe(self, params: TranscriptionParams) -> Iterator[TranscriptionResult]:
        name = params.audio_bytes()[len(b"RIFF"):].decode()  # the test names each request in its bytes
        cancelled = threading.Event()
        try:
            partials = 2 if not name[0].isdigit() else int(name[0])
            for i in range(partials):
                if i:
                    self._wait_for_step(name, cancelled)
                yield TranscriptionResult(text=f" {name}{i}", final=False)
            if name.startswith("explode"):
                raise Exploding(f"{name} blew up")
            if name.startswith("nofinal"):
                return
            self._wait_for_step(name, cancelled)
            yield TranscriptionResult(text=f"{name} whole")
        finally:
            self.closed.append(name)


def transcription(name: str) -> TranscriptionParams:
    return TranscriptionParams.of_audio("local/fake", b"RIFF" + name.encode())


def results_of(sink: RecordingSink, request_id: str) -> list[TranscriptionResult]:
    return [payload.result for kind, payload in sink.of(request_id)  # type: ignore[union-attr]
            if kind == "token" and isinstance(payload, GeneratedResult)]  # type: ignore[misc]


def test_a_streamed_workload_passes_each_result_then_completes_on_the_final(make) -> None:
    engine = TranscribingScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("t", transcription("3.wav"))
    engine.step("3.wav", 3)
    wait_until(lambda: sink.finished("t"))
    assert [(r.text, r.final) for r in results_of(sink, "t")] == [
        (" 3.wav0", False), (" 3.wav1", False), (" 3.wav2", False), ("3.wav whole", True)]
    assert sink.results()["t"].outcome == "completed"
    assert engine.closed == ["3.wav"]


def test_a_cancel_between_results_closes_the_engine_iterator(make) -> None:
    engine = TranscribingScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("t", transcription("5.wav"))
    dispatcher.submit("u", transcription("1.wav"))
    wait_until(lambda: len(results_of(sink, "t")) == 1)
    assert dispatcher.cancel("t") is True
    engine.step("5.wav")  # the engine yields its next result: the dispatcher drops it and closes the iterator
    wait_until(lambda: sink.finished("t"))
    assert [r.text for r in results_of(sink, "t")] == [" 5.wav0"]
    assert sink.results()["t"] == GenerationResult(outcome="cancelled", finish_reason="cancelled")
    assert engine.closed[0] == "5.wav", "the engine's iterator was closed, so it stopped decoding"
    engine.step("1.wav")
    wait_until(lambda: sink.finished("u"))  # the queue moves on
    assert sink.results()["u"].outcome == "completed"
    assert dispatcher.in_flight == 0


@pytest.mark.parametrize(("name", "error_type", "message"), [
    ("nofinal.wav", "EngineError", "without a final one"),
    ("explode.wav", "Exploding", "blew up"),
])
def test_a_stream_without_its_final_result_fails(make, name, error_type, message) -> None:
    engine = TranscribingScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("t", transcription(name))
    engine.step(name)
    wait_until(lambda: sink.finished("t"))
    result = sink.results()["t"]
    assert (result.outcome, result.error_type) == ("failed", error_type)
    assert message in (result.error_message or "")
    assert len(results_of(sink, "t")) == 2 and engine.closed == [name]


def test_an_engine_without_the_streamed_workload_refuses_it_typed(make) -> None:
    dispatcher, sink = make(ScriptedEngine())
    dispatcher.submit("t", transcription("1.wav"))
    wait_until(lambda: sink.finished("t"))
    result = sink.results()["t"]
    assert (result.outcome, result.error_type) == ("failed", "WorkloadUnsupported")


@pytest.mark.parametrize(("tamper", "says"), [
    ({"sha256": "0" * 64}, "SHA-256 differs"),
    ({"data_b64": "not base64!"}, "not valid base64"),
])
def test_an_image_whose_bytes_are_not_the_checked_ones_never_reaches_the_engine(make, tamper, says) -> None:
    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.media import IMAGE_MARKER, ImageInput

    image = ImageInput.of(b"\x89PNG fake bytes", "image/png", 1, 1).model_copy(update=tamper)
    engine = ScriptedEngine()
    dispatcher, sink = make(engine)
    dispatcher.submit("img", TextGenerationParams(
        model_id="local/fake", messages=[ChatMessage(role="user", content=IMAGE_MARKER, images=[image])]))
    wait_until(lambda: sink.finished("img"))
    result = sink.results()["img"]
    assert (result.outcome, result.error_type) == ("failed", "protocol_violation")
    assert says in (result.error_message or "")
    assert engine.started == []
