"""The developer guide's multi-turn task API on convsim: ``MultiTurnTask``.

A subclass names its scenarios (``DATASET_PATH``, scenarios.jsonl format) and turn flows
(``TURN_CONFIG_PATH``, turn_configs.yml format) and may override the guide's hooks:
``get_conversation_flow``, ``build_conversation_context``, ``generate_turn_prompt``,
``process_turn``, ``evaluate_turn``, ``evaluate_conversation`` and the
``calculate_*`` methods.

convsim's runtime plays the conversation: every turn's prompt comes from
``generate_turn_prompt`` (given ``build_conversation_context`` of the history), the
model answers through its adapter (budgets, retries, concurrency, resume), and the
conversation then goes through the task's own hooks: ``process_turn`` for each turn,
in order, and ``evaluate_conversation`` over the turns. Its numeric results are the
``task:<key>`` scores. The default conversation metrics are convsim's own scorers:
``context_retention``, ``goal_achievement`` and ``coherence`` on the conversation just
run, with the scenario's facts, probes and goal.

``get_model_response(prompt, turn_config)`` in ``process_turn``:

- the turn's own prompt gets the answer the model gave in the conversation (no call);
- another prompt is an extra call to the model under test. The hooks run when the
  conversation is scored, right after its last turn and before its result is built,
  in the scoring session's worker thread; the call goes back to the event loop and
  through the run's own adapter (``convsim.metrics.ask_model``): the same rate and
  token budgets, token caps, concurrency, retries and response cache as the turns,
  the turn's history before its prompt and the turn's settings. It is made once per
  turn and prompt, kept on the turn's record (``TurnRecord.extra_calls``: prompt,
  response, usage, latency, attempts, cache, error), and its tokens count in the
  conversation's usage and cost (and so in ``--max-cost``). The conversation's own
  deadline does not cover it (its turns are over); the run's stop does.
- a failed extra call fails the conversation's ``task:<key>`` scores with its cause
  (``ExtraCallFailed``), not the conversation or the run;
- a conversation already finished is never played or scored again by a resume, so its
  extra calls are not made again; ``convsim score`` on recorded results reads the
  answers recorded on the turns and never calls a model (a prompt without a recorded
  answer fails the task's scores, saying so).

Run it with ``convsim.run_sync(task.to_pack(), MODEL)``, or under lm-eval with
``task.to_lm_eval_task()`` and ``--model convsim``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import statistics
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from convsim._errors import ConfigError, ConvsimError, TranscriptTooLong
from convsim._records import TurnRecord
from convsim._types import Message
from convsim.metrics import METRICS, ScoringSession, TfidfEmbedder, ask_model, cosine
from convsim.scenarios import (
    Conversation,
    Pack,
    PreparedTurn,
    Template,
    load_multi_turn_files,
    render_context,
)

from .._plural import counted
from ._export import conversation_request, conversation_scores, require_convsim_model
from ._task_metric import TASK_METRIC_PREFIX, numeric
from ._tasks import TASKS, AdvancedTask

__all__ = ["ExtraCallFailed", "MultiTurnTask"]


class ExtraCallFailed(ConvsimError):
    """A task's ``get_model_response`` asked the model a prompt of its own and the call
    failed: the conversation's task scores fail with this cause."""


CONVERSATION_METRICS = ("context_retention", "goal_achievement", "coherence_score")
"""What the default evaluate_conversation reports beside the turns' averages."""


@dataclass(frozen=True)
class _Scoring:
    """What the task's hooks may read while convsim scores a conversation it ran."""

    conversation: Conversation
    turns: tuple[TurnRecord, ...]
    current: TurnRecord | None = None


_SCORING: contextvars.ContextVar[_Scoring | None] = contextvars.ContextVar(
    "convsim_task_scoring", default=None
)


class MultiTurnTask(AdvancedTask):
    """Base class of multi-turn tasks written with the guide's API.

    ``DATASET_PATH`` and ``TURN_CONFIG_PATH`` are absolute or relative to the subclass's
    module file (``config["dataset_path"]`` / ``config["turn_config_path"]`` override
    them). Each document is one scenario; its conversation runs in convsim's runtime.
    """

    DATASET_PATH: str | None = "scenarios.jsonl"
    TURN_CONFIG_PATH: str | None = "turn_configs.yml"
    ALLOW_CODE: bool = False
    """Let the task's files run the code they name (``python`` goal criteria), as
    ``--allow-code`` does for a pack: set it on a subclass whose files you trust."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.turn_configs: dict[str, Any] = {}
        self.load_turn_configurations()

    # -- the files -----------------------------------------------------------------

    def turn_config_file(self) -> Path:
        return self._task_file(
            self.config.get("turn_config_path") or self.TURN_CONFIG_PATH, "TURN_CONFIG_PATH"
        )

    def load_turn_configurations(self) -> None:
        """Read the turn flows into ``self.turn_configs`` (validated by :meth:`to_pack`)."""
        path = self.turn_config_file()
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"cannot read the task's turn configs {path}: {exc.strerror}"
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path.name}: invalid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path.name}: must map each scenario_type to its flow")
        self.turn_configs = loaded

    # -- the guide's hooks -----------------------------------------------------------

    def get_conversation_flow(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """The flow of ``doc``: its scenario_type's, else ``default``."""
        scenario_type = doc.get("scenario_type", "default")
        flow = self.turn_configs.get(scenario_type, self.turn_configs.get("default"))
        if not isinstance(flow, dict):
            raise ConfigError(f"{self.name}: no flow {scenario_type!r} and no 'default'")
        return flow

    def build_conversation_context(self, conversation_history: Sequence[Mapping[str, str]]) -> str:
        """The history as text (``User: ...`` / ``Assistant: ...`` lines)."""
        return render_context(
            [Message(role=m["role"], content=m["content"]) for m in conversation_history]  # type: ignore[arg-type]
        )

    def generate_turn_prompt(
        self,
        doc: Mapping[str, Any],
        turn_config: Mapping[str, Any],
        context: str,
        turn_index: int,
    ) -> str:
        """The turn's ``prompt_template`` with ``{context}``, ``{scenario}``,
        ``{turn_index}`` and the scenario's variables (convsim's safe templates)."""
        values: dict[str, object] = dict(doc.get("variables") or {})
        values.update(
            context=context, scenario=doc.get("scenario_description", ""), turn_index=turn_index
        )
        return Template.parse(str(turn_config.get("prompt_template", ""))).render(values)

    def get_model_response(self, prompt: str, turn_config: Mapping[str, Any]) -> str:
        """The model's answer to ``prompt`` for the turn being processed.

        The turn's own prompt (the one ``generate_turn_prompt`` gave, which the model
        was sent) gets the answer the model gave in the conversation: no call. Another
        prompt is one more call to the model under test, through the run's adapter
        (see the module's docstring), recorded on the turn's ``extra_calls``; scoring
        recorded turns again reads the answer recorded there.

        Raises:
            ConfigError: outside convsim's scoring of a conversation, or another prompt
                when no model can be asked (recorded turns without that call).
            ExtraCallFailed: the extra call failed (its cause is the message).
        """
        scoring = _SCORING.get()
        if scoring is None or scoring.current is None:
            raise ConfigError(
                f"{self.name}: get_model_response answers only while convsim scores a "
                "conversation it ran; run the task with convsim.run_sync(task.to_pack(), "
                "MODEL) or under lm-eval with --model convsim"
            )
        record = scoring.current
        if prompt == record.prompt:
            return record.response or ""
        recorded = [c for c in record.extra_calls if c.prompt == prompt]
        call = recorded[-1] if recorded else ask_model(record, prompt)
        if call.error is not None:
            raise ExtraCallFailed(
                f"{self.name}: turn {record.turn_id!r}: get_model_response's call with a "
                f"prompt of its own failed: {call.error.type}: {call.error.message}"
            )
        return call.response or ""

    def process_turn(
        self,
        doc: Mapping[str, Any],
        turn_config: Mapping[str, Any],
        conversation_history: Sequence[Mapping[str, str]],
        turn_index: int,
    ) -> dict[str, Any]:
        """One turn: its prompt, the model's response and the turn's metrics."""
        context = self.build_conversation_context(conversation_history)
        prompt = self.generate_turn_prompt(doc, turn_config, context, turn_index)
        response = self.get_model_response(prompt, turn_config)
        metrics = self.evaluate_turn(doc, turn_config, response, conversation_history)
        return {
            "turn_index": turn_index,
            "prompt": prompt,
            "response": response,
            "metrics": metrics,
        }

    def evaluate_turn(
        self,
        doc: Mapping[str, Any],
        turn_config: Mapping[str, Any],
        response: str,
        conversation_history: Sequence[Mapping[str, str]],
    ) -> dict[str, float]:
        """``response_length`` (words), ``relevance_score``, and each of the turn's
        ``evaluation_metrics``: a ``calculate_<name>(response, doc, history)`` method of
        the task if it has one, else convsim's metric of that name on this turn."""
        metrics: dict[str, float] = {"response_length": float(len(response.split()))}
        relevance = self.calculate_relevance(response, doc)
        if relevance is not None:
            metrics["relevance_score"] = relevance
        for name in turn_config.get("evaluation_metrics") or []:
            hook = getattr(self, f"calculate_{name}", None)
            value = (
                hook(response, doc, conversation_history)
                if callable(hook)
                else self._convsim_turn_metric(name)
            )
            if value is not None:
                metrics[name] = float(value)
        return metrics

    def evaluate_conversation(
        self, doc: Mapping[str, Any], conversation_turns: Sequence[Mapping[str, Any]]
    ) -> dict[str, float]:
        """The turns' metrics averaged (:meth:`aggregate_turn_metrics`), then
        ``context_retention``, ``goal_achievement`` and ``coherence_score`` from
        convsim's scorers; a metric that does not apply is left out."""
        out: dict[str, float | None] = dict(
            self.aggregate_turn_metrics([t.get("metrics") or {} for t in conversation_turns])
        )
        out["context_retention"] = self.calculate_context_retention(conversation_turns)
        out["goal_achievement"] = self.calculate_goal_achievement(doc, conversation_turns)
        out["coherence_score"] = self.calculate_coherence(conversation_turns)
        return {k: v for k, v in out.items() if v is not None}

    def aggregate_turn_metrics(self, turn_metrics: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Each numeric turn metric's mean over the turns that have it."""
        values: dict[str, list[float]] = {}
        for metrics in turn_metrics:
            for key, value in metrics.items():
                if numeric(value):
                    values.setdefault(key, []).append(float(value))
        return {key: statistics.fmean(v) for key, v in values.items()}

    def calculate_relevance(self, response: str, doc: Mapping[str, Any]) -> float | None:
        """TF-IDF cosine of the response to the scenario (description and variables);
        None when there are no comparable words."""
        scenario = " ".join(
            [str(doc.get("scenario_description", ""))]
            + [str(v) for v in (doc.get("variables") or {}).values()]
        )
        similarity = cosine(TfidfEmbedder(), [response, scenario], [(0, 1)])
        return similarity[0] if similarity is not None else None

    def calculate_context_retention(
        self, conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """convsim's ``context_retention`` of the conversation (its facts and probes)."""
        return self._convsim_conversation_metric("context_retention")

    def calculate_goal_achievement(
        self, doc: Mapping[str, Any], conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """convsim's ``goal_achievement`` of the conversation (the scenario's goal)."""
        return self._convsim_conversation_metric("goal_achievement")

    def calculate_coherence(self, conversation_turns: Sequence[Mapping[str, Any]]) -> float | None:
        """convsim's ``coherence`` of the conversation."""
        return self._convsim_conversation_metric("coherence")

    def aggregation(self) -> dict[str, Any]:
        return {name: "mean" for name in CONVERSATION_METRICS}

    def higher_is_better(self) -> dict[str, bool]:
        return {name: True for name in CONVERSATION_METRICS}

    # -- convsim's metrics on the conversation being scored --------------------------

    def _scoring(self, what: str) -> _Scoring:
        scoring = _SCORING.get()
        if scoring is None:
            raise ConfigError(
                f"{self.name}: {what} scores a conversation convsim ran; run the task with "
                "convsim.run_sync(task.to_pack(), MODEL)"
            )
        return scoring

    def _convsim_conversation_metric(self, name: str) -> float | None:
        scoring = self._scoring(f"convsim's {name}")
        return _value(name, scoring.conversation, scoring.turns)

    def _convsim_turn_metric(self, name: str) -> float | None:
        scoring = self._scoring(f"convsim's {name}")
        if scoring.current is None:
            raise ConfigError(f"{self.name}: convsim's {name} scores a turn, in process_turn")
        return _value(name, scoring.conversation, (scoring.current,))

    # -- running under convsim -------------------------------------------------------

    def turn_config(self, doc: Mapping[str, Any], turn_id: str) -> dict[str, Any]:
        """The raw turn config of ``turn_id`` in ``doc``'s flow (as the hooks get it); a
        ``repeat`` copy (``chat.2``) gets its turn's config."""
        turns = [
            t for t in self.get_conversation_flow(doc).get("turns") or [] if isinstance(t, dict)
        ]
        for wanted in (turn_id, turn_id.rsplit(".", 1)[0]):
            for turn in turns:
                if turn.get("turn_id") == wanted:
                    return turn
        raise ConfigError(f"{self.name}: no turn {turn_id!r} in the flow")

    def to_pack(self) -> Pack:
        """A multi-turn pack: one conversation per document, prompted by the task's
        hooks and scored by its ``evaluate_conversation`` through ``task:<key>``."""
        base, flows = load_multi_turn_files(
            self.dataset_file(), self.turn_config_file(), METRICS, allow_code=self.ALLOW_CODE
        )
        for scenario_type, flow in flows.items():
            for turn in flow.turns:
                own = [
                    m for m in turn.config.evaluation_metrics if m.startswith(TASK_METRIC_PREFIX)
                ]
                if own:
                    raise ConfigError(
                        f"{self.turn_config_file().name}: {scenario_type}.{turn.turn_id}: "
                        f"evaluation_metrics {', '.join(own)}: a task's own results score "
                        "whole conversations; name its turn metrics without 'task:'"
                    )
        by_id = {c.conversation_id: c for c in base.conversations}
        flow_names = {id(flow): name for name, flow in self.turn_configs.items()}
        conversations = []
        for doc in self.eval_docs():
            scenario_id = doc.get("scenario_id") if isinstance(doc, Mapping) else None
            if scenario_id not in by_id:
                raise ConfigError(f"{self.name}: document {scenario_id!r} is not in the dataset")
            flow_name = flow_names.get(id(self.get_conversation_flow(doc)))
            if flow_name not in flows:
                raise ConfigError(
                    f"{self.name}: get_conversation_flow must return one of the flows of "
                    f"self.turn_configs ({', '.join(map(str, self.turn_configs))})"
                )
            base_conversation = by_id[scenario_id]
            origin = ConversationDocument(self, doc)
            conversations.append(
                _TaskConversation(
                    base_conversation.scenario,
                    flows[flow_name],
                    "multi_turn",
                    base_conversation.source,
                    origin=origin,
                )
            )
        digest = hashlib.sha256(base.pack_hash.encode())
        digest.update(f"\0task\0{self.name}\0{self.VERSION}".encode())
        return dataclasses.replace(
            base,
            name=f"task:{self.name}",
            pack_hash=digest.hexdigest(),
            conversations=tuple(conversations),
            metrics=tuple(TASK_METRIC_PREFIX + m for m in self.metric_names()),
        )

    # -- running under lm-eval (``to_lm_eval_task``): a document is a conversation -------

    def doc_to_text(self, doc: Any) -> str:
        return str(doc.get("scenario_description", "")) if isinstance(doc, Mapping) else ""

    def doc_to_target(self, doc: Any) -> str:
        return ""

    def request_arguments(self, doc: Any) -> dict[str, Any]:
        return {"prompt": self.lm_eval_context(doc), "until": [], "max_tokens": None}

    def lm_eval_context(self, doc: Any) -> str:
        """The conversation request the ``convsim`` lm-eval model runs (and only it:
        another model is refused before lm-eval generates anything). The task class
        must be registered (``@register_task``): the model loads it as ``task:NAME``."""
        require_convsim_model(self.name)
        if self.config:
            raise ConfigError(
                f"{type(self).__name__}: under lm-eval the convsim model loads the registered "
                "class as task:NAME with its defaults, so a task built with a config "
                f"({', '.join(map(str, self.config))}) cannot run there; set DATASET_PATH "
                "and TURN_CONFIG_PATH on a subclass instead"
            )
        if self.name not in TASKS or TASKS.get(self.name) is not type(self):
            raise ConfigError(
                f"{type(self).__name__}: register the task class with "
                f"@register_task({self.name!r}) to run it under lm-eval"
            )
        return conversation_request(f"task:{self.name}", str(doc["scenario_id"]))

    def lm_eval_results(self, doc: Any, results: list[str]) -> dict[str, Any]:
        names = [TASK_METRIC_PREFIX + m for m in self.metric_names()]
        scores = conversation_scores(self.name, results[0] if results else "", names)
        return {name[len(TASK_METRIC_PREFIX) :]: value for name, value in scores.items()}


def _value(name: str, conversation: Conversation, turns: Sequence[TurnRecord]) -> float | None:
    """convsim's metric ``name`` over ``turns``: its value, None when it does not apply;
    a failed score raises."""
    session = ScoringSession(conversation, [METRICS.get(name)()])
    if session.awaits:
        raise ConfigError(f"convsim's {name} needs a judge model, which task hooks do not have")
    score = session.score_now(turns).scores[name]
    if score.status == "failed":
        raise RuntimeError(f"convsim's {name} failed: {score.reason}")
    return None if score.value is None else float(score.value)


@dataclass(frozen=True)
class _TaskConversation(Conversation):
    """A conversation whose prompts come from its task's ``generate_turn_prompt``."""

    def render(
        self,
        turn: PreparedTurn,
        transcript: Sequence[Message],
        *,
        max_chars: int | None = None,
    ) -> str:
        origin: ConversationDocument = self.origin
        prompt = origin.prompt(turn, transcript)
        if max_chars is not None and len(prompt) > max_chars:
            raise TranscriptTooLong(
                f"the task's prompt passes the {counted(max_chars, 'character', grouped=True)} "
                "left in the conversation's transcript (max_transcript_chars)",
                limit=max_chars,
            )
        return prompt


_EVALUATIONS_KEPT = 64
"""Evaluations a document keeps, the latest: the conversations (trials, runs) of one
document being scored at once."""


@dataclass
class ConversationDocument:
    """A multi-turn conversation's origin: its task and document. The task's hooks run
    once per scoring of a conversation, whichever ``task:<key>`` metric asks first; the
    trials of a document, scored at the same time, each keep their own evaluation and
    do not wait on each other's hooks (which may call the model)."""

    task: MultiTurnTask
    doc: Any
    _evaluations: OrderedDict[tuple[int, ...], _Evaluated] = field(
        default_factory=OrderedDict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def prompt(self, turn: PreparedTurn, transcript: Sequence[Message]) -> str:
        history = _history(transcript)
        context = self.task.build_conversation_context(history)
        turn_config = self.task.turn_config(self.doc, turn.turn_id)
        return self.task.generate_turn_prompt(self.doc, turn_config, context, turn.index)

    def results(
        self, conversation: Conversation, turns: Sequence[TurnRecord]
    ) -> dict[str, Any] | str:
        if not turns:
            return "no turn of the conversation completed"
        # the metrics of one scoring are given the very same records; another run or
        # trial of the conversation is evaluated anew (its hooks may ask the model again)
        key = tuple(id(t) for t in turns)  # the entry keeps them alive: ids stay theirs
        with self._lock:
            entry = self._evaluations.get(key)
            if entry is None or not entry.of(turns):
                entry = self._evaluations[key] = _Evaluated(tuple(turns))
                while len(self._evaluations) > _EVALUATIONS_KEPT:
                    self._evaluations.popitem(last=False)
            else:
                self._evaluations.move_to_end(key)
        with entry.lock:
            if entry.outcome is None:
                try:
                    entry.outcome = self._evaluate(conversation, turns)
                except Exception as exc:  # each metric fails with it, the hooks run once
                    entry.outcome = exc
        if isinstance(entry.outcome, Exception):
            raise entry.outcome
        return entry.outcome

    def _evaluate(self, conversation: Conversation, turns: Sequence[TurnRecord]) -> dict[str, Any]:
        processed = []
        for record in turns:
            turn_config = self.task.turn_config(self.doc, record.turn_id)
            history = _history(record.messages[:-1])
            with _scoring(_Scoring(conversation, tuple(turns), record)):
                turn = self.task.process_turn(self.doc, turn_config, history, record.turn_index)
            processed.append({**turn, "turn_id": record.turn_id})
        with _scoring(_Scoring(conversation, tuple(turns))):
            return dict(self.task.evaluate_conversation(self.doc, processed))


@dataclass
class _Evaluated:
    """The task's results (or the error its hooks raised) for one scoring's turns; None
    until its hooks have run, under its lock."""

    turns: tuple[TurnRecord, ...]
    outcome: dict[str, Any] | Exception | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def of(self, turns: Sequence[TurnRecord]) -> bool:
        """Whether these are the very records evaluated."""
        return len(turns) == len(self.turns) and all(
            a is b for a, b in zip(turns, self.turns, strict=True)
        )


@contextmanager
def _scoring(state: _Scoring) -> Iterator[None]:
    token = _SCORING.set(state)
    try:
        yield
    finally:
        _SCORING.reset(token)


def _history(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as the guide's ``conversation_history``: role/content dicts, no system."""
    return [{"role": m.role, "content": m.content} for m in messages if m.role != "system"]
