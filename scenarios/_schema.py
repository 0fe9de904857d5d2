"""The scenario pack file formats, as pydantic models.

Multi-turn packs: ``scenarios.jsonl`` (one :class:`Scenario` per line) and
``turn_configs.yml`` (a mapping of scenario_type -> :class:`Flow`). Single-turn packs:
``problems.jsonl`` (one :class:`Problem` per line) and ``config.yml``
(:class:`SingleTurnConfig`). Every model forbids unknown fields so a typo is an error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._tool_schema import TOOL_NAME_PATTERN, ExpectedToolCall, StateCheck, TrajectoryMode

__all__ = [
    "BUILTIN_VARIABLES",
    "LANGUAGE_PATTERN",
    "Scalar",
    "TurnSettings",
    "TurnConfig",
    "Flow",
    "Fact",
    "Probe",
    "Criterion",
    "Goal",
    "UserProfile",
    "Scenario",
    "Problem",
    "DatasetConfig",
    "DatasetFormat",
    "HF_DEFAULT_SPLIT",
    "MetricsConfig",
    "EvaluationConfig",
    "PromptTemplates",
    "SingleTurnConfig",
]

#: Names every multi-turn template may use besides the scenario's variables.
BUILTIN_VARIABLES = frozenset({"context", "scenario", "turn_index"})

Scalar = str | int | float | bool
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
LANGUAGE_PATTERN = r"^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$"
"""A language tag as BCP 47 writes them (``en``, ``pt-BR``, ``zh-Hant``), compared as
written."""
Language = Annotated[str, Field(pattern=LANGUAGE_PATTERN)]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TurnSettings(_Input):
    """Sampling settings of one turn (the guide's ``config``)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: list[str] | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """Sent where the model's API has it (OpenAI-compatible servers); a model whose API
    has none (Anthropic) refuses the turn before the run."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)


class TurnConfig(_Input):
    """One turn of a flow.

    ``role`` names the side that answers the rendered ``prompt_template``:
    ``assistant`` (default): the rendered template is the user's next message and the
    model under test answers it. ``user``: the rendered template is an instruction to
    the simulated user, whose reply becomes the user's next message; the model under
    test then answers that. A ``user`` turn needs a user model (``--user-model``).
    """

    turn_id: str = Field(pattern=_ID)
    role: Literal["assistant", "user"] = "assistant"
    prompt_template: str
    depends_on: list[str] = Field(default_factory=list)
    """Turns that must have completed; if one failed or was skipped this turn is skipped."""
    optional: bool = False
    """An optional turn runs only when the scenario defines all its template variables,
    and its failure does not fail the conversation."""
    evaluation_metrics: list[str] = Field(default_factory=list)
    """Metrics scored on this turn alone (names from the metric registry)."""
    config: TurnSettings = Field(default_factory=TurnSettings)
    description: str | None = None
    repeat: int = Field(default=1, ge=1, le=200)
    """Run this turn up to this many times in a row (ids ``ID``, ``ID.2``, ...): with
    ``role: user``, a stretch of simulated conversation that its stop conditions end."""
    tools: list[Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]] | None = None
    """The pack's tools offered on this turn; None offers every tool of the pack (none
    in a pack without ``tools.yml``), an empty list none."""
    tool_choice: str | None = Field(default=None, pattern=TOOL_NAME_PATTERN)
    """``auto``, ``required`` (the model must call a tool), ``none`` (it must not) or
    a tool's name (it must call that one); None leaves the model's default."""
    max_tool_rounds: int | None = Field(default=None, ge=0, le=50)
    """Model calls of this turn that may ask for tools before it must answer; the
    flow's when None."""


class Flow(_Input):
    """The turns of one scenario_type."""

    max_turns: int | None = Field(default=None, ge=1)
    """At most this many turns are run; later ones are skipped (reason max_turns).
    None: as many as the flow has."""
    conversation_timeout: float = Field(default=300.0, gt=0)
    """Seconds the whole conversation may take before it ends TIMED_OUT."""
    system_prompt: str | None = None
    """A system message sent before the first turn (a scenario's own one wins)."""
    metrics: list[str] = Field(default_factory=list)
    """Conversation-level metrics for scenarios of this type."""
    max_tool_rounds: int = Field(default=5, ge=0, le=50)
    """Model calls of a turn that may ask for tools before the turn ends without an
    answer (``tool_round_limit``)."""
    turns: list[TurnConfig] = Field(min_length=1)


class Fact(_Input):
    """A fact the user introduces that the model should retain."""

    key: str = Field(pattern=_ID)
    value: Scalar
    aliases: list[str] = Field(default_factory=list)
    introduced_in: str
    """turn_id of the turn whose user message introduces the fact."""
    tolerance: float | None = Field(default=None, ge=0)
    """For numeric facts: the largest accepted absolute difference."""


class Probe(_Input):
    """A turn whose answer needs facts introduced earlier."""

    turn_id: str
    facts: list[str] = Field(min_length=1)


class Criterion(_Input):
    """One success criterion of a goal, checked against a response."""

    kind: Literal["contains", "regex", "number", "json_schema", "python", "judge", "state"]
    value: Any
    """What the criterion checks for; for ``state``, a :class:`StateCheck` on the tools'
    environment document after the conversation (``{"path": ..., "equals": ...}``)."""
    tolerance: float | None = Field(default=None, ge=0)
    turn_id: str | None = None
    """The turn whose response is checked; the final response when None."""


class Goal(_Input):
    """What a conversation should achieve."""

    description: str
    all_of: list[Criterion] = Field(default_factory=list)
    any_of: list[Criterion] = Field(default_factory=list)


class UserProfile(_Input):
    """Who the simulated user is and when they stop."""

    persona: str = ""
    """Who they are, e.g. "a busy nurse who ordered a blood-pressure monitor"."""
    goal: str | None = None
    """What they want; defaults to the scenario goal's description."""
    style: str | None = None
    """How they write, e.g. "short, informal, a little impatient"."""
    stop_marker: str = Field(default="[DONE]", min_length=1)
    """The simulated user says this to end the conversation."""
    stop_on_goal: bool = True
    """End the conversation as soon as the scenario goal's criteria hold."""


class Scenario(_Input):
    """One conversation to simulate (a line of scenarios.jsonl)."""

    scenario_id: str = Field(pattern=_ID)
    scenario_type: str = "default"
    scenario_description: str
    variables: dict[str, Scalar] = Field(default_factory=dict)
    system_prompt: str | None = None
    difficulty: str | None = None
    facts: list[Fact] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    goal: Goal | None = None
    user: UserProfile | None = None
    """The simulated user of ``role: user`` turns."""
    required_keywords: list[str] = Field(default_factory=list)
    reference_responses: dict[str, str] = Field(default_factory=dict)
    """Reference answers by turn_id; the scripted model replays them."""
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] | None = None
    """The tools' environment document this scenario starts from; None starts from the
    pack's (``tools.yml`` ``environment``)."""
    expected_tool_calls: tuple[ExpectedToolCall, ...] = ()
    """The calls the model should make, in order (``tool_call_accuracy``,
    ``trajectory_match``)."""
    trajectory_mode: TrajectoryMode = "strict"
    """How ``trajectory_match`` compares the calls made with ``expected_tool_calls``."""
    final_state: tuple[StateCheck, ...] = ()
    """What the environment document must hold after the conversation (``final_state``)."""

    @field_validator("variables")
    @classmethod
    def _no_builtin_names(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        clash = sorted(BUILTIN_VARIABLES & value.keys())
        if clash:
            raise ValueError(f"{', '.join(clash)} are built-in template variables")
        bad = sorted(k for k in value if not k.isidentifier())
        if bad:
            raise ValueError(f"variable names must be identifiers: {', '.join(bad)}")
        return value


class Problem(_Input):
    """One single-turn problem (a line of problems.jsonl)."""

    id: str | None = Field(default=None, pattern=_ID)
    question: str
    expected_answer: str
    context: str = ""
    required_keywords: list[str] = Field(default_factory=list)
    difficulty: str | None = None
    domain: str | None = None
    language: Language | None = None
    """The language the problem is written in; ``metadata.language`` says the same
    (one of the two, or both alike). None: unspecified."""
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


DatasetFormat = Literal["jsonl", "csv", "parquet", "hf"]
HF_DEFAULT_SPLIT = "test"


class DatasetConfig(_Input):
    """Where a single-turn pack's problems come from (config.yml ``dataset``)."""

    path: str | None = None
    """jsonl, csv and parquet: the file, inside the pack folder; by default
    ``problems.jsonl``, ``problems.csv`` or ``problems.parquet``."""
    format: DatasetFormat = "jsonl"
    """``jsonl`` (a problem per line), ``csv`` (a header of problem fields, then a
    problem per row), ``parquet`` (a column per problem field) or ``hf`` (a dataset read
    through the ``datasets`` library: ``name``, ``split``, ``config``, ``revision``)."""
    size: int | None = Field(default=None, ge=1, strict=True)
    """Run this many problems, sampled from the dataset by seed (the run's ``--seed``,
    else 0); larger than the dataset: all of it, with a note. None: all of it."""
    name: str | None = None
    """hf only: the dataset's name on the Hugging Face hub, or a folder relative to the
    pack (one written by ``save_to_disk``, or data files ``load_dataset`` reads)."""
    config: str | None = None
    """hf only: the dataset's configuration (``load_dataset``'s ``name``)."""
    split: str | None = None
    """hf only: the split to read; default ``test``."""
    revision: str | None = None
    """hf only: the hub revision (a tag, branch or commit) to read."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Problem field -> the dataset's column holding it, for data whose columns are
    named otherwise (``expected_answer: answer``); unmapped fields keep their names."""

    @property
    def file(self) -> str:
        """The data file a jsonl, csv or parquet dataset reads; the name of an hf one."""
        if self.format == "hf":
            return self.name or ""
        return self.path or f"problems.{self.format}"


class MetricsConfig(_Input):
    primary: list[str] = Field(default_factory=list)
    secondary: list[str] = Field(default_factory=list)


ContextMode = Literal["no_context", "minimal_context", "full_context"]


def _full_context() -> list[ContextMode]:
    return ["full_context"]


class EvaluationConfig(_Input):
    context_modes: list[ContextMode] = Field(default_factory=_full_context, min_length=1)
    """The context modes the pack supports; a run picks one (``--context-mode``)."""
    languages: list[Language] = Field(default_factory=lambda: ["en"], min_length=1)
    """The languages the pack runs. When config.yml lists them, a problem that carries
    a language (its ``language`` or ``metadata.language``) outside the list is left out
    (the pack's notes count them); problems without a language are kept (summaries
    count them as ``unspecified``). Left out of config.yml, nothing is filtered."""
    difficulty_levels: list[str] = Field(default_factory=list)
    """When given, every problem's difficulty must be one of these."""


class PromptTemplates(_Input):
    default: str
    with_examples: str | None = None
    """Used with few-shot examples; ``{examples}`` holds them."""


class SingleTurnConfig(_Input):
    """config.yml of a single-turn pack."""

    task_name: str = Field(pattern=_ID)
    task_type: Literal["single_turn"] = "single_turn"
    description: str = ""
    version: float | str = 1.0
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    evaluation_config: EvaluationConfig = Field(default_factory=EvaluationConfig)
    prompt_templates: PromptTemplates
    system_prompt: str | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
