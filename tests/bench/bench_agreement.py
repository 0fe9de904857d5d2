"""Agreement benchmark: convsim's coherence and retention scorers against human ratings.

Run: python tests/bench/bench_agreement.py DATA_DIR [--limit N]

DATA_DIR is the folder of public human-rated dialogue data (e.g. ../shared/data), with
the subfolders usr/, fed/, grade/ and holistic/, each read through its own load.py. The
data is never copied into the repository: transcripts and scores live in a temporary
directory.

Transcripts follow what the ratings apply to:

- per-response ratings (USR, FED turn level, GRADE, Holistic): the rated response is the
  last assistant message and its context comes before it, roles alternating backwards
  from the response (so the context's last utterance is a user message);
- per-dialogue ratings (FED dialogue level): the whole dialogue, "User:" lines as user
  messages and "System:" lines as assistant messages.

USR's grounding travels in the transcript's ``metadata``: PersonaChat's persona lines as
``persona`` (the rated responder's: ``consistency`` holds the assistant to it), and
Topical-Chat's reading passage as ``knowledge``.

Every file is scored by the real command, in a subprocess:
``python -m convsim score FILE --metrics
coherence,lexical_coherence,consistency,conversation_flow,context_retention --out
SCORES``. Scorer
variants read from the scores are correlated (Spearman and Pearson, scipy) with the mean
human rating, and printed beside the published figures
copied from the data folders' READMEs (Yeh et al. 2021 via exe1023/DialEvalMetrics,
UniEval, DEAM, a FED replication). A scorer is correlated over the transcripts it
scored; a table gives, per metric and data set, the share of transcripts scored (the
others are not applicable: nothing to check, or no evidence either way). The script
ends with a summary paragraph.

This is a benchmark script, not a test: it defines no test functions and importing it
does nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

METRICS = "coherence,lexical_coherence,consistency,conversation_flow,context_retention"
NLI_METRICS = "consistency,nli_coherence,context_retention"
"""Scored a second time when CONVSIM_NLI_MODEL names a model folder; the results are
kept as ``<metric>@nli`` beside the pattern and WordLlama ones."""

# --------------------------------------------------------------------------------------
# Published figures, copied from the READMEs in the data folders.
# kind: "lexical" (n-gram overlap with the reference response: non-learned),
#       "embedding" (BERTScore: pretrained BERT embeddings against the reference, not
#                    trained on dialogue ratings: non-learned),
#       "learned"  (a model trained or fine-tuned for dialogue evaluation, or a dialogue
#                    language model's likelihood).
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    metric: str
    kind: str
    pearson: float | None
    spearman: float | None
    source: str
    not_significant: str = ""  # "P", "S" or "PS": figures the source marks with '*'

    @property
    def non_learned(self) -> bool:
        return self.kind in ("lexical", "embedding")


YEH = "Yeh et al. 2021"


def _yeh(rows: Sequence[tuple[Any, ...]], what: str) -> list[Published]:
    """Rows of (metric, kind, pearson, spearman[, not significant]); a '*' suffix on the
    metric marks both figures as not significant, a fifth item "P" or "S" just one."""
    out = []
    for metric, kind, p, s, *rest in rows:
        ns = rest[0] if rest else "PS" if metric.endswith("*") else ""
        out.append(Published(metric.rstrip("*"), kind, p, s, f"{YEH}, {what}", ns))
    return out


USR_OVERALL_TC = [
    *_yeh(
        [
            ("BLEU-4", "lexical", 0.216, 0.296),
            ("METEOR", "lexical", 0.336, 0.391),
            ("ROUGE-L", "lexical", 0.275, 0.287),
            ("BERTScore", "embedding", 0.298, 0.325),
            ("BERT-RUBER", "learned", 0.342, 0.348),
            ("GRADE", "learned", 0.200, 0.217),
            ("USR", "learned", 0.412, 0.423),
            ("USL-H", "learned", 0.322, 0.340),
            ("DynaEval*", "learned", -0.032, -0.022),
            ("FED", "learned", -0.124, -0.135),
        ],
        "Overall",
    ),
    Published("UniEval overall", "learned", 0.633, 0.663, "UniEval repo"),
]

USR_OVERALL_PC = _yeh(
    [
        ("BLEU-4", "lexical", 0.135, 0.090, "S"),
        ("METEOR", "lexical", 0.253, 0.271),
        ("ROUGE-L*", "lexical", 0.066, 0.038),
        ("BERTScore", "embedding", 0.152, 0.122, "S"),
        ("BERT-RUBER", "learned", 0.266, 0.248),
        ("GRADE", "learned", 0.358, 0.352),
        ("USR", "learned", 0.440, 0.418),
        ("USL-H", "learned", 0.495, 0.523),
        ("DynaEval", "learned", 0.149, 0.171),
        ("FED*", "learned", -0.028, -0.000),
    ],
    "Overall",
)

USR_TC_CONTEXT = [
    Published("UniEval coherence (= Maintains Context)", "learned", 0.595, 0.613, "UniEval repo")
]
USR_TC_KNOWLEDGE = [
    Published("UniEval groundedness (= Uses Knowledge)", "learned", 0.536, 0.575, "UniEval repo")
]

FED_REPL = "DSincerity/FED_Replication (third party; a sanity range, not a target)"
FED_DIALOG_OVERALL = _yeh(
    [
        ("DynaEval", "learned", 0.503, 0.547),
        ("FED", "learned", 0.222, 0.320),
        ("USL-H*", "learned", 0.073, 0.152),
        ("DEB*", "learned", -0.130, 0.006),
        ("GRADE*", "learned", -0.034, -0.065),
        ("USR*", "learned", 0.093, 0.062),
        ("HolisticEval", "learned", -0.276, -0.304),
        ("DialogRPT", "learned", -0.221, -0.214),
    ],
    "FED dialogue Overall",
)
FED_TURN_OVERALL = _yeh(
    [
        ("DynaEval", "learned", 0.319, 0.323),
        ("FED", "learned", 0.120, 0.095),
        ("USL-H", "learned", 0.201, 0.189),
        ("DEB", "learned", 0.230, 0.187),
        ("GRADE", "learned", 0.134, 0.118),
        ("USR", "learned", 0.114, 0.117),
        ("HolisticEval", "learned", 0.122, 0.125),
        ("DialogRPT", "learned", -0.118, -0.086, "S"),
    ],
    "FED turn Overall",
)
FED_COHERENT = [
    Published("DEAM", "learned", None, 0.468, "PlusLabNLP/DEAM coherence_results.json"),
    Published("FED (DialoGPT-large, replication)", "learned", 0.074, 0.171, FED_REPL),
]
FED_CONSISTENT = [
    Published("FED (DialoGPT-large, replication)", "learned", -0.043, 0.035, FED_REPL)
]
FED_UNDERSTANDING = [
    Published("FED (DialoGPT-large, replication)", "learned", 0.178, 0.173, FED_REPL)
]
FED_RELEVANT = [Published("FED (DialoGPT-large, replication)", "learned", 0.147, 0.153, FED_REPL)]

_GRADE_ROWS = {  # metric: (ConvAI2 P, S, DailyDialog P, S, Empathetic P, S)
    "GRADE": (0.566, 0.571, 0.278, 0.253, 0.330, 0.297),
    "DEB": (0.426, 0.504, 0.337, 0.363, 0.356, 0.395),
    "USR": (0.501, 0.500, 0.057, 0.057, 0.264, 0.255),
    "USL-H": (0.443, 0.457, 0.108, 0.093, 0.293, 0.235),
    "PONE": (0.362, 0.373, 0.163, 0.163, 0.177, 0.161),
    "BERTScore": (0.225, 0.224, 0.129, 0.100, 0.046, 0.033),
}
_GRADE_NOT_SIGNIFICANT = {  # (metric, column): figures marked '*'
    ("USR", 1): "PS",
    ("USL-H", 1): "PS",
    ("BERTScore", 1): "S",
    ("BERTScore", 2): "PS",
}


def _grade_published(column: int, what: str) -> list[Published]:
    return [
        Published(
            metric,
            "embedding" if metric == "BERTScore" else "learned",
            figures[2 * column],
            figures[2 * column + 1],
            f"{YEH}, GRADE {what} coherence",
            _GRADE_NOT_SIGNIFICANT.get((metric, column), ""),
        )
        for metric, figures in _GRADE_ROWS.items()
    ]


HOLISTIC_CONTEXT = _yeh(
    [
        ("GRADE", "learned", 0.678, 0.697),
        ("HolisticEval", "learned", 0.670, 0.764),
        ("DEB", "learned", 0.584, 0.663),
        ("USR", "learned", 0.589, 0.645),
        ("USL-H", "learned", 0.486, 0.537),
        ("FED", "learned", 0.485, 0.507),
        ("DialogRPT", "learned", 0.283, 0.332),
        ("MAUDE", "learned", 0.275, 0.364),
        ("QuestEval", "learned", 0.285, 0.260),
        ("DynaEval*", "learned", -0.023, -0.009),
    ],
    "HolisticEval-DailyDialog context coherence",
)

# --------------------------------------------------------------------------------------
# Data sets
# --------------------------------------------------------------------------------------


@dataclass
class Item:
    id: str
    messages: list[dict[str, str]]
    ratings: dict[str, float]  # mean over annotators
    group: str  # the subset published figures are given for (GRADE) or the system
    response: str  # the rated response ("" for a dialogue)
    system: str = ""  # the system that produced the rated text, when group is not it
    metadata: dict[str, Any] = field(default_factory=dict)  # persona or knowledge, if any

    @property
    def who(self) -> str:
        return self.system or self.group


@dataclass
class Dimension:
    rating: str  # key in Item.ratings
    label: str
    published: dict[str, list[Published]] = field(default_factory=dict)  # by group
    note: str = ""


@dataclass
class Dataset:
    key: str
    title: str
    short: str
    level: str  # "response" or "dialogue"
    items: list[Item]
    dimensions: list[Dimension]
    groups: dict[str, str] = field(default_factory=dict)  # group -> label, besides "all"
    how: str = ""


def import_loader(folder: Path) -> ModuleType:
    """The folder's load.py, imported by path."""
    path = folder / "load.py"
    spec = importlib.util.spec_from_file_location(f"_agreement_load_{folder.name}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mean_rating(scores: Sequence[Any]) -> float | None:
    values = [float(v) for v in scores if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def response_messages(context: Sequence[str], response: str) -> list[dict[str, str]]:
    """The rated response last, as an assistant message; the context before it, roles
    alternating backwards (the utterance right before the response is the user's)."""
    messages = [{"role": "assistant", "content": response}]
    role = "user"
    for utterance in reversed(context):
        messages.append({"role": role, "content": utterance})
        role = "assistant" if role == "user" else "user"
    return messages[::-1]


def _speaker(line: str) -> tuple[str, str]:
    """FED lines: 'User: ...' is the user, 'System: ...' the assistant."""
    head, _, text = line.partition(":")
    role = {"user": "user", "system": "assistant"}.get(head.strip().lower())
    if role is None:
        raise ValueError(f"FED line without a User:/System: speaker: {line[:60]!r}")
    return role, text.strip()


def _ratings(raw: dict[str, Sequence[Any]], keys: Sequence[str]) -> dict[str, float]:
    out = {}
    for key in keys:
        value = mean_rating(raw.get(key, ()))
        if value is not None:
            out[key] = value
    return out


def load_usr(root: Path) -> list[Dataset]:
    loader = import_loader(root / "usr")
    keys = ("Maintains Context", "Uses Knowledge", "Overall")
    out = []
    for name, title, overall in (
        ("topicalchat", "USR Topical-Chat", USR_OVERALL_TC),
        ("personachat", "USR PersonaChat", USR_OVERALL_PC),
    ):
        items = [
            Item(
                r["id"],
                response_messages(r["context"], r["response"]),
                _ratings(r["ratings"], keys),
                r["model"],
                r["response"],
                # the responder's persona (PersonaChat) or reading passage (Topical-Chat)
                metadata={"persona" if name == "personachat" else "knowledge": r["fact"]},
            )
            for r in loader.load(name, root=root / "usr")
        ]
        tc = name == "topicalchat"
        out.append(
            Dataset(
                f"usr-{name}",
                title,
                title,
                "response",
                items,
                [
                    Dimension(
                        "Maintains Context",
                        "Maintains Context (1-3, mean of 3 annotators)",
                        {"all": USR_TC_CONTEXT} if tc else {},
                        "" if tc else "no published per-quality figures for PersonaChat",
                    ),
                    Dimension(
                        "Uses Knowledge",
                        "Uses Knowledge (0-1, mean of 3 annotators)",
                        {"all": USR_TC_KNOWLEDGE} if tc else {},
                        "the knowledge passage / persona travel in the transcript's "
                        "metadata, but only consistency reads the persona (no scorer reads "
                        "the passage); shown for completeness"
                        + ("" if tc else "; no published per-quality figures for PersonaChat"),
                    ),
                    Dimension(
                        "Overall",
                        "Overall (1-5, mean of 3 annotators)",
                        {"all": overall},
                        "not a coherence rating, but the only USR quality with published "
                        "non-learned baselines (BLEU/METEOR/ROUGE/BERTScore use the ground-"
                        "truth response as reference; convsim is reference-free)",
                    ),
                ],
                how="rated response = last assistant message; the dialogue history before "
                "it, roles alternating backwards",
            )
        )
    return out


def load_fed(root: Path) -> list[Dataset]:
    loader = import_loader(root / "fed")
    records = list(loader.load(root=root / "fed"))
    dialog_keys = ("Coherent", "Consistent", "Understanding", "Overall")
    turn_keys = ("Relevant", "Semantically appropriate", "Overall")
    dialogs, turns = [], []
    for r in records:
        if r["level"] == "dialog":
            messages = [
                {"role": role, "content": text} for role, text in map(_speaker, r["context"])
            ]
            dialogs.append(
                Item(r["id"], messages, _ratings(r["ratings"], dialog_keys), r["system"], "")
            )
        else:
            context = [text for _, text in map(_speaker, r["context"])]
            role, response = _speaker(r["response"])
            if role != "assistant":
                raise ValueError(f"{r['id']}: the rated FED response is not the system's")
            turns.append(
                Item(
                    r["id"],
                    response_messages(context, response),
                    _ratings(r["ratings"], turn_keys),
                    r["system"],
                    response,
                )
            )
    return [
        Dataset(
            "fed-dialog",
            "FED dialogue level",
            "FED dialogue",
            "dialogue",
            dialogs,
            [
                Dimension("Coherent", "Coherent (0-2, mean of 5)", {"all": FED_COHERENT}),
                Dimension("Consistent", "Consistent (0-1, mean of 5)", {"all": FED_CONSISTENT}),
                Dimension(
                    "Understanding", "Understanding (0-2, mean of 5)", {"all": FED_UNDERSTANDING}
                ),
                Dimension(
                    "Overall",
                    "Overall (0-4, mean of 5)",
                    {"all": FED_DIALOG_OVERALL},
                    "for comparison with the Yeh et al. table, which covers Overall only",
                ),
            ],
            how="the whole dialogue; 'User:' lines -> user, 'System:' lines -> assistant",
        ),
        Dataset(
            "fed-turn",
            "FED turn level (extra: the brief asks for the dialogue level)",
            "FED turn",
            "response",
            turns,
            [
                Dimension("Relevant", "Relevant (0-2, mean of 5)", {"all": FED_RELEVANT}),
                Dimension("Semantically appropriate", "Semantically appropriate (0-2, mean of 5)"),
                Dimension("Overall", "Overall (0-4, mean of 5)", {"all": FED_TURN_OVERALL}),
            ],
            how="rated system response = last assistant message; the context before it",
        ),
    ]


def load_grade(root: Path) -> list[Dataset]:
    loader = import_loader(root / "grade")
    items = [
        Item(
            r["id"],
            response_messages(r["context"], r["response"]),
            _ratings(r["ratings"], ("coherence",)),
            r["dataset"],
            r["response"],
            r["model"],
        )
        for r in loader.load(root=root / "grade")
    ]
    groups = {
        "convai2": "ConvAI2",
        "dailydialog_EVAL": "DailyDialog",
        "empatheticdialogues": "EmpatheticDialogues",
    }
    published = {
        group: _grade_published(i, label) for i, (group, label) in enumerate(groups.items())
    }
    return [
        Dataset(
            "grade",
            "GRADE human coherence judgements",
            "GRADE",
            "response",
            items,
            [Dimension("coherence", "coherence (1-5, mean of 8-11 annotators)", published)],
            groups,
            how="two context turns (assistant, user) then the rated response",
        )
    ]


def load_holistic(root: Path) -> list[Dataset]:
    loader = import_loader(root / "holistic")
    items = [
        Item(
            r["id"],
            response_messages(r["context"], r["response"]),
            _ratings(r["ratings"], ("context_coherence",)),
            "dailydialog",
            r["response"],
        )
        for r in loader.load(root=root / "holistic", quality="context_coherence")
    ]
    return [
        Dataset(
            "holistic",
            "Holistic (Pang et al.) context coherence",
            "Holistic",
            "response",
            items,
            [
                Dimension(
                    "context_coherence",
                    "context coherence (1-5, mean of 10)",
                    {"all": HOLISTIC_CONTEXT},
                )
            ],
            how="one user utterance then the rated response (a single turn)",
        )
    ]


def spread(items: list[Item], limit: int | None) -> list[Item]:
    """At most ``limit`` items, evenly spaced so every group and system keeps a share."""
    if limit is None or limit >= len(items):
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


# --------------------------------------------------------------------------------------
# Scoring through the command line
# --------------------------------------------------------------------------------------


def run_score(
    dataset: Dataset, folder: Path, nli: bool = False
) -> tuple[dict[str, dict[str, Any]], float]:
    """Scores by conversation id from ``convsim score``, and the command's wall time:
    without an NLI model (the pattern and WordLlama backends), or with ``nli`` the
    NLI_METRICS with the model of CONVSIM_NLI_MODEL, named ``<metric>@nli``."""
    suffix = ".nli" if nli else ""
    transcripts = folder / f"{dataset.key}.jsonl"
    out = folder / f"{dataset.key}{suffix}.scores.jsonl"
    with open(transcripts, "w", encoding="utf-8") as fh:
        for item in dataset.items:
            row = {"conversation_id": item.id, "messages": item.messages}
            if item.metadata:
                row["metadata"] = item.metadata
            fh.write(json.dumps(row) + "\n")
    metrics = NLI_METRICS if nli else METRICS
    cmd = [sys.executable, "-m", "convsim", "score", str(transcripts), "--metrics", metrics]
    env = dict(os.environ)
    if not nli:
        env.pop("CONVSIM_NLI_MODEL", None)
    started = time.perf_counter()
    proc = subprocess.run(
        [*cmd, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(
            f"convsim score failed on {dataset.key} (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:] or proc.stdout[-3000:]}"
        )
    scores = {}
    for line in out.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            scores[row["conversation_id"]] = {
                f"{k}@nli" if nli else k: v for k, v in row["scores"].items()
            }
    missing = [i.id for i in dataset.items if i.id not in scores]
    if missing:
        raise SystemExit(f"{dataset.key}: no scores for {len(missing)} conversations")
    return scores, elapsed


# --------------------------------------------------------------------------------------
# Scorer variants
# --------------------------------------------------------------------------------------

Extract = Callable[[dict[str, Any], Item], "float | str | None"]


@dataclass(frozen=True)
class Variant:
    name: str
    extract: Extract  # a number, or a str: why there is none
    primary: bool = False
    reference: bool = False  # not a convsim scorer: a yardstick


def _value(metric: str) -> Extract:
    def get(scores: dict[str, Any], item: Item) -> float | str | None:
        score = scores.get(metric) or {}
        value = score.get("value")
        return value if value is not None else (score.get("reason") or "no value")

    return get


def _detail(metric: str, key: str, index: int | None = None) -> Extract:
    def get(scores: dict[str, Any], item: Item) -> float | str | None:
        score = scores.get(metric) or {}
        if score.get("value") is None:
            return score.get("reason") or "no value"
        value = (score.get("details") or {}).get(key)
        if value is None:
            return f"{metric} details have no {key!r}"
        if index is not None:
            if not value:
                return f"{metric} details {key!r} is empty"
            value = value[index]
        return value

    return get


def _words_in_response(scores: dict[str, Any], item: Item) -> float:
    return float(len(item.response.split()))


def _words_per_assistant_msg(scores: dict[str, Any], item: Item) -> float | str:
    words = [len(m["content"].split()) for m in item.messages if m["role"] == "assistant"]
    return sum(words) / len(words) if words else "no assistant message"


RESPONSE_VARIANTS = [
    Variant(
        "coherence: the rated (last) response's turn score",
        _detail("coherence", "last_turn"),
        primary=True,
    ),
    Variant("coherence: conversation value (25th percentile of turns)", _value("coherence")),
    Variant(
        "lexical_coherence: last-turn relevance (TF-IDF, the earlier default)",
        _detail("lexical_coherence", "relevance_by_turn", -1),
    ),
    Variant("lexical_coherence: conversation value", _value("lexical_coherence")),
    Variant("conversation_flow: value (all turns)", _value("conversation_flow")),
    Variant("context_retention: value", _value("context_retention")),
    Variant("consistency: value (with the persona, where given)", _value("consistency")),
    Variant(
        "nli_coherence@nli: the rated response's turn score",
        _detail("nli_coherence@nli", "last_turn"),
    ),
    Variant("consistency@nli: value", _value("consistency@nli")),
    Variant("context_retention@nli: value", _value("context_retention@nli")),
    Variant("(yardstick) words in the rated response", _words_in_response, reference=True),
]

DIALOGUE_VARIANTS = [
    Variant("coherence: value (25th percentile of turns)", _value("coherence"), primary=True),
    Variant("coherence: mean of turns", _detail("coherence", "mean")),
    Variant("lexical_coherence: value (the earlier default)", _value("lexical_coherence")),
    Variant("lexical_coherence: relevance component", _detail("lexical_coherence", "relevance")),
    Variant("conversation_flow: value", _value("conversation_flow")),
    Variant("conversation_flow: progression", _detail("conversation_flow", "progression")),
    Variant("consistency: value", _value("consistency")),
    Variant("context_retention: value", _value("context_retention")),
    Variant("nli_coherence@nli: value (25th percentile of turns)", _value("nli_coherence@nli")),
    Variant("consistency@nli: value", _value("consistency@nli")),
    Variant("context_retention@nli: value", _value("context_retention@nli")),
    Variant("(yardstick) words per assistant message", _words_per_assistant_msg, reference=True),
]


# --------------------------------------------------------------------------------------
# Statistics and printing
# --------------------------------------------------------------------------------------


@dataclass
class Correlation:
    n: int
    r: float | None = None
    p_r: float | None = None
    rho: float | None = None
    p_rho: float | None = None
    why: str = ""

    def rho_ci(self) -> tuple[float, float] | None:
        """95% interval of rho (Fisher z, normal approximation)."""
        if self.rho is None or self.n <= 3 or abs(self.rho) >= 1:
            return None
        z, half = math.atanh(self.rho), 1.96 / math.sqrt(self.n - 3)
        return math.tanh(z - half), math.tanh(z + half)


def correlate(xs: Sequence[float | str | None], ys: Sequence[float | None]) -> Correlation:
    from scipy import stats

    pairs = [
        (float(x), float(y))
        for x, y in zip(xs, ys, strict=True)
        if isinstance(x, (int, float)) and y is not None and math.isfinite(x)
    ]
    if len(pairs) < 3:
        reasons = Counter(x for x in xs if isinstance(x, str))
        why = reasons.most_common(1)[0][0] if reasons else "no value"
        if pairs:
            why = f"only {len(pairs)} value(s); the others: {why}"
        return Correlation(len(pairs), why=why)
    a, b = zip(*pairs, strict=True)
    if len(set(a)) < 2 or len(set(b)) < 2:
        return Correlation(len(pairs), why="constant scores")
    r, p_r = stats.pearsonr(a, b)
    rho, p_rho = stats.spearmanr(a, b)
    return Correlation(len(pairs), float(r), float(p_r), float(rho), float(p_rho))


def _f(value: float | None, width: int = 7) -> str:
    return f"{value:{width}.3f}" if value is not None else f"{'-':>{width}}"


def _p(value: float | None) -> str:
    return f"{value:8.1e}" if value is not None else f"{'-':>8}"


NAME_WIDTH = 76
KIND_LABELS = {
    "lexical": "non-learned: n-gram overlap with the reference",
    "embedding": "non-learned: BERT embeddings vs the reference",
    "learned": "learned",
}


def print_table(
    title: str,
    rows: list[tuple[Variant, Correlation]],
    published: list[Published],
    note: str,
) -> None:
    print(f"\n  -- {title}")
    if note:
        print(f"     ({note})")
    head = f"     {'scorer':<{NAME_WIDTH}} {'n':>5} {'r':>7} {'p':>8} {'rho':>7} {'p':>8}"
    print(head + "  rho 95% CI")
    for variant, c in rows:
        mark = " [primary]" if variant.primary else ""
        name = (variant.name + mark)[:NAME_WIDTH]
        if c.rho is None:
            print(f"     {name:<{NAME_WIDTH}} {c.n:>5}   n/a: {c.why}")
            continue
        ci = c.rho_ci()
        ci_text = f"  [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        print(
            f"     {name:<{NAME_WIDTH}} {c.n:>5} {_f(c.r)} {_p(c.p_r)} {_f(c.rho)} {_p(c.p_rho)}"
            + ci_text
        )
    if published:
        for pub in published:
            name = f"published: {pub.metric} [{KIND_LABELS[pub.kind]}]"[:NAME_WIDTH]
            r_star = "*" if "P" in pub.not_significant else " "
            s_star = "*" if "S" in pub.not_significant else " "
            print(
                f"     {name:<{NAME_WIDTH}} {'':>5} {_f(pub.pearson)}{r_star}{'':>7} "
                f"{_f(pub.spearman)}{s_star}"
            )
        sources = sorted({p.source for p in published})
        print(f"     published figures from: {'; '.join(sources)}")
        if any(p.not_significant for p in published):
            print("     * the source marks the figure as not significant (p >= 0.05)")
    else:
        print("     published: none given in the data README for this rating")


@dataclass
class Comparison:
    """One (data set, subset, rating) that has published figures, for the summary."""

    label: str
    primary: Correlation
    yardstick: Correlation | None
    best_non_learned: Published | None
    best_learned: Published | None


def _best(published: list[Published], non_learned: bool) -> Published | None:
    pool = [p for p in published if p.non_learned == non_learned and p.spearman is not None]
    return max(pool, key=lambda p: p.spearman or -1.0, default=None)


def print_by_system(
    dataset: Dataset, scores: dict[str, dict[str, Any]], variant: Variant, dim: Dimension
) -> None:
    """Means per system: how much of the correlation is between systems, not within."""
    systems = sorted({i.who for i in dataset.items})
    if len(systems) < 2:
        return
    print(f"\n  -- by system: mean of the primary scorer and of {dim.rating}, and rho within")
    print(f"     {'system':<32} {'n':>5} {'scorer':>8} {'human':>8} {'rho':>7}")
    for system in systems:
        items = [i for i in dataset.items if i.who == system]
        xs = [variant.extract(scores[i.id], i) for i in items]
        ys = [i.ratings.get(dim.rating) for i in items]
        nums = [x for x in xs if isinstance(x, (int, float))]
        hum = [y for y in ys if y is not None]
        c = correlate(xs, ys)
        print(
            f"     {system[:32]:<32} {len(items):>5} "
            f"{_f(sum(nums) / len(nums) if nums else None, 8)} "
            f"{_f(sum(hum) / len(hum) if hum else None, 8)} {_f(c.rho)}"
        )


def evaluate(dataset: Dataset, scores: dict[str, dict[str, Any]]) -> list[Comparison]:
    variants = RESPONSE_VARIANTS if dataset.level == "response" else DIALOGUE_VARIANTS
    if not any(k.endswith("@nli") for row in scores.values() for k in row):
        variants = [v for v in variants if "@nli" not in v.name]  # no NLI model given
    comparisons: list[Comparison] = []
    groups = {"all": "all items", **dataset.groups}
    for dim in dataset.dimensions:
        for group, group_label in groups.items():
            items = [i for i in dataset.items if group == "all" or i.group == group]
            if not items:
                continue
            ys = [i.ratings.get(dim.rating) for i in items]
            rows = []
            for variant in variants:
                xs = [variant.extract(scores[i.id], i) for i in items]
                rows.append((variant, correlate(xs, ys)))
            published = dim.published.get(group, [])
            title = f"human rating: {dim.label}" + (
                f"  |  subset: {group_label}" if dataset.groups else ""
            )
            print_table(title, rows, published, dim.note)
            if published:
                comparisons.append(
                    Comparison(
                        dataset.short
                        + (f" {group_label}" if group != "all" else "")
                        + f" / {dim.rating}",
                        next(c for v, c in rows if v.primary),
                        next((c for v, c in rows if v.reference), None),
                        _best(published, True),
                        _best(published, False),
                    )
                )
    primary = next(v for v in variants if v.primary)
    print_by_system(dataset, scores, primary, dataset.dimensions[0])
    return comparisons


def verdict(ours: Correlation, theirs: float) -> str:
    """'above', 'below' or 'level': is ``theirs`` outside our rho's 95% interval?"""
    ci = ours.rho_ci()
    if ci is None:
        return "level"
    return "above" if theirs < ci[0] else "below" if theirs > ci[1] else "level"


def _rho(c: Correlation) -> str:
    return "n/a" if c.rho is None else f"{c.rho:.2f}"


def summary(comparisons: list[Comparison], retention_note: str) -> str:
    scored = [c for c in comparisons if c.primary.rho is not None]
    buckets: dict[str, list[str]] = {"above": [], "level": [], "below": []}
    for comp in scored:
        base = comp.best_non_learned
        if base is not None and base.spearman is not None:
            buckets[verdict(comp.primary, base.spearman)].append(
                f"{comp.label} ({_rho(comp.primary)} vs {base.metric} {base.spearman:.2f})"
            )
    learned_ahead, learned_not = [], []
    for comp in scored:
        best = comp.best_learned
        if best is None or best.spearman is None:
            continue
        text = f"{comp.label} ({_rho(comp.primary)} vs {best.metric} {best.spearman:.2f})"
        (learned_ahead if verdict(comp.primary, best.spearman) == "below" else learned_not).append(
            text
        )
    negative = [
        f"{c.label} ({_rho(c.primary)})"
        for c in scored
        if (ci := c.primary.rho_ci()) is not None and ci[1] < 0
    ]
    yard = [
        c
        for c in scored
        if c.yardstick is not None
        and c.yardstick.rho is not None
        and c.yardstick.rho >= (c.primary.rho or 0.0)
    ]

    parts = [
        "Summary. The headline scorer is fixed (a rated response: coherence's score of "
        "that last turn, its WordLlama fit to the user turn and to the context, scaled down "
        "for an echo; a whole dialogue: the coherence value, the 25th percentile of its "
        "turns, an aggregation chosen on FED, the only dialogue-level set here) and is "
        "compared by Spearman rho; a published figure counts as beaten or not only when it "
        "lies outside convsim's 95% interval. The other variants are diagnostics: picking "
        "the best of them afterwards would flatter convsim. coherence is not trained on "
        "these ratings: it has no fitted weights, so there is no leave-one-dataset-out "
        "figure to give; its two choices (the echo threshold, the percentile) were made on "
        "this data and are the place to look for overfitting on data it never saw."
    ]
    words = {"above": "above it on ", "level": "level with it (within noise) on ", "below": ""}
    said = [words[k] + "; ".join(v) for k, v in buckets.items() if v and k != "below"]
    if buckets["below"]:
        said.append("below it on " + "; ".join(buckets["below"]))
    if said:
        parts.append(
            "Against the best published non-learned baseline (rho: convsim vs baseline), "
            "convsim is " + ", and ".join(said) + "."
        )
    parts.append(
        "Non-learned baselines are published only for USR Overall (BLEU-4, METEOR, ROUGE-L "
        "and BERTScore, which compare with the ground-truth response that convsim, being "
        "reference-free, never sees) and for the GRADE subsets (BERTScore); USR Maintains "
        "Context, FED and Holistic have figures for learned metrics only."
    )
    if learned_ahead:
        parts.append(
            f"Learned metrics are clearly ahead on {len(learned_ahead)} of "
            f"{len(learned_ahead) + len(learned_not)} ratings with published learned "
            "figures"
            + (
                "; convsim is not clearly behind on " + "; ".join(learned_not)
                if learned_not
                else ""
            )
            + "."
        )
    if negative:
        parts.append(
            "The headline scorer correlates significantly negatively with "
            + "; ".join(negative)
            + ": lexical overlap rewards replies that echo the user's words, and a fitting "
            "reply that shares no content word with the turn scores 0."
        )
    if yard:
        parts.append(
            "Word count (of the rated response, or per assistant message for a dialogue), "
            f"a yardstick and not a scorer, does as well or better on {len(yard)} of "
            f"{len(scored)} of these ratings."
        )
    parts.append(retention_note)
    return " ".join(parts)


def applicability(all_scores: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Per metric and data set, the share of transcripts scored (with a value): the
    correlations above are over those alone; the others are not applicable or failed."""
    names = METRICS.split(",")
    if any(
        k.endswith("@nli") for scores in all_scores.values() for row in scores.values() for k in row
    ):
        names += [f"{n}@nli" for n in NLI_METRICS.split(",")]
    print("\n== Applicability: share of transcripts scored, per metric and data set ==")
    print(f"     {'set':<18} {'transcripts':>11}" + "".join(f" {n:>17}" for n in names))
    for key, scores in all_scores.items():
        rows = list(scores.values())
        cells = []
        for name in names:
            statuses = Counter((row.get(name) or {}).get("status") for row in rows)
            cell = f"{statuses['ok'] / max(1, len(rows)):.0%}"
            if statuses["failed"]:
                cell += f" ({statuses['failed']} failed)"
            cells.append(f" {cell:>17}")
        print(f"     {key:<18} {len(rows):>11}" + "".join(cells))
    print(
        "   scored: the metric measured something (a value); the rest are not applicable "
        "(nothing to check, or no evidence either way) unless counted as failed"
    )


def retention_status(all_scores: dict[str, dict[str, dict[str, Any]]]) -> str:
    """How often the user states something reference-free context_retention can check in
    the free, human-rated conversations, and how often a later answer gives evidence
    (a recall or a forgetting): only those are scored."""
    print("\n== context_retention without facts (reference-free) ==")
    print(
        f"     {'set':<18} {'transcripts':>11} {'stated':>8} {'evidence':>9} {'scored':>8} "
        f"{'forgotten':>9}"
    )
    total = stated_total = evidence = 0
    for key, scores in all_scores.items():
        rows = [row.get("context_retention") or {} for row in scores.values()]
        stated = [s for s in rows if (s.get("details") or {}).get("checks", 0) > 0]
        seen = [s for s in stated if s["details"].get("evidence", 0) > 0]
        scored = [s for s in rows if s.get("value") is not None]
        forgot = [s for s in stated if s["details"].get("forgotten", 0) > 0]
        total, stated_total, evidence = (
            total + len(rows),
            stated_total + len(stated),
            evidence + len(seen),
        )
        print(
            f"     {key:<18} {len(rows):>11} {len(stated) / max(1, len(rows)):>8.0%} "
            f"{len(seen) / max(1, len(stated)):>9.0%} {len(scored) / max(1, len(rows)):>8.0%} "
            f"{len(forgot):>9}"
        )
    print(
        "   stated: in a transcript of two turns or more (one turn has nothing earlier to "
        "keep), the user stated something checkable (about themself, a number, name or ID, "
        "an answer to the assistant's question); evidence: of those, a later answer "
        "recalled or forgot one of them; scored: of all, the transcripts with a value "
        "(the others are not applicable: one turn, nothing stated, or no evidence)"
    )
    return (
        f"context_retention without facts found something stated in {stated_total} of "
        f"{total} transcripts ({stated_total / max(1, total):.0%}) and evidence (a recall or "
        f"a forgetting) in only {evidence} of them: only those are scored, the rest are not "
        "applicable, so its agreement with people rests on few transcripts here."
    )


# --------------------------------------------------------------------------------------
# A learned alternative, held out one data set at a time
# --------------------------------------------------------------------------------------

LODO_SETS = {
    "usr-topicalchat": "Maintains Context",
    "fed-turn": "Relevant",
    "grade": "coherence",
    "holistic": "context_coherence",
}
FEATURES = (
    "sim_user",
    "sim_context",
    "sim_max_turn",
    "echo",
    "novelty",
    "asked",
    "question",
    "log_words",
)


def _features(embedder: Any, item: Item) -> list[float]:
    """Features of the rated response in its context: semantic fit (WordLlama) to the
    user turn, to the whole context and to its closest earlier turn; the share of its
    content words that echo the user turn or are new; questions; length."""
    from convsim.metrics._coherence import content_words

    context = [m["content"] for m in item.messages[:-1] if m["content"].strip()] or [""]
    response = item.messages[-1]["content"]
    vectors = embedder.embed([response, context[-1], " ".join(context), *context])
    r, user, whole, turns = vectors[0], vectors[1], vectors[2], vectors[3:]
    said = content_words(response)
    before = set().union(*(content_words(c) for c in context))
    words = len(response.split())
    return [
        float(r @ user),
        float(r @ whole),
        float(max(turns @ r)),
        len(said & content_words(context[-1])) / max(1, len(said)),
        len(said - before) / max(1, len(said)),
        float(context[-1].rstrip().endswith("?")),
        float("?" in response),
        math.log1p(words),
    ]


def learned_lodo(datasets: list[Dataset], scores: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Ridge regression on the features, trained on three sets (each weighted equally,
    ratings ranked within each set) and tested on the fourth, beside coherence."""
    import numpy as np
    from scipy.stats import rankdata, spearmanr
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    from convsim.metrics._wordllama import WordLlamaEmbedder

    embedder = WordLlamaEmbedder()
    rows: dict[str, tuple[Any, Any, list[float]]] = {}
    for d in datasets:
        rating = LODO_SETS.get(d.key)
        if rating is None:
            continue
        items = [i for i in d.items if i.ratings.get(rating) is not None]
        x = np.array([_features(embedder, i) for i in items])
        y = np.array([i.ratings[rating] for i in items])
        fixed = [scores[d.key][i.id]["coherence"]["details"].get("last_turn") for i in items]
        rows[d.key] = (x, y, [float("nan") if v is None else v for v in fixed])
    print("\n== A learned alternative, leave-one-dataset-out (Spearman on the held-out set) ==")
    print(f"   ridge regression on {', '.join(FEATURES)}")
    print(f"     {'held out':<18} {'n':>5} {'ridge':>7} {'coherence':>10}  coefficients")
    for held in rows:
        train = [k for k in rows if k != held]
        x = np.vstack([rows[k][0] for k in train])
        y = np.concatenate([(rankdata(rows[k][1]) - 0.5) / len(rows[k][1]) for k in train])
        weight = np.concatenate([np.full(len(rows[k][1]), 1 / len(rows[k][1])) for k in train])
        scaler = StandardScaler().fit(x)
        model = Ridge(alpha=10.0).fit(scaler.transform(x), y, sample_weight=weight * len(y))
        hx, hy, fixed = rows[held]
        rho = spearmanr(model.predict(scaler.transform(hx)), hy)[0]
        ok = ~np.isnan(np.asarray(fixed))
        base = spearmanr(np.asarray(fixed)[ok], hy[ok])[0]
        coef = " ".join(f"{n}={c:+.2f}" for n, c in zip(FEATURES, model.coef_, strict=True))
        print(f"     {held:<18} {len(hy):>5} {rho:>7.3f} {base:>10.3f}  {coef}")
    print(
        "   A learned scorer ships only where it beats coherence on the held-out sets; the "
        "single features' signs differ between sets (length above all), so it does not."
    )


def contradiction_auroc(
    dataset: Dataset, scores: dict[str, dict[str, Any]], metric: str = "consistency"
) -> None:
    """consistency against FED's "Consistent" rating as a contradiction detector: AUROC
    for telling the dialogues people found inconsistent (mean rating below 1) apart,
    within dialogues of equal length (longer ones hold more contradictions, so length
    alone must not be what is detected). A dialogue with nothing to check counts as
    consistent (score 1)."""
    from sklearn.metrics import roc_auc_score

    rows = []
    applicable = 0
    for item in dataset.items:
        rating = item.ratings.get("Consistent")
        if rating is None:
            continue
        value = (scores[item.id].get(metric) or {}).get("value")
        applicable += value is not None
        rows.append((len(item.messages), int(rating < 1), 1.0 if value is None else value))
    weighted = total = 0.0
    for length in sorted({n for n, _, _ in rows}):
        group = [(y, x) for n, y, x in rows if n == length]
        labels = {y for y, _ in group}
        if len(labels) == 2:
            auc = roc_auc_score([y for y, _ in group], [-x for _, x in group])
            weighted += auc * len(group)
            total += len(group)
    auroc = weighted / total if total else float("nan")
    inconsistent = sum(y for _, y, _ in rows)
    print(
        f"\n== {metric} as a contradiction detector (FED dialogues, {inconsistent} of "
        f"{len(rows)} rated inconsistent) ==\n"
        f"   AUROC within equal lengths {auroc:.3f} over {int(total)} dialogues in lengths "
        f"with both kinds; {metric} applicable on {applicable} of {len(rows)} (target 0.70)"
    )


# --------------------------------------------------------------------------------------
# Judge metrics (--judge SPEC): the conversational judges beside the offline scorers
# --------------------------------------------------------------------------------------

JUDGE_FITS = {
    "Maintains Context": ("judge:turn_relevancy", "judge:knowledge_retention"),
    "Relevant": ("judge:turn_relevancy",),
    "coherence": ("judge:turn_relevancy",),
    "context_coherence": ("judge:turn_relevancy",),
    "Coherent": ("judge:turn_relevancy", "judge:conversation_completeness"),
    "Consistent": ("judge:knowledge_retention",),
    "Understanding": ("judge:turn_relevancy",),
    "Overall": ("judge:conversation_completeness",),
}
"""Per human rating, the judge metrics that measure something like it (ratings absent
here, such as Uses Knowledge, have none)."""


def run_judge_score(
    dataset: Dataset, folder: Path, spec: str, judge_args: Sequence[str], samples: int
) -> dict[str, dict[str, Any]]:
    """Scores by conversation id from ``convsim score --judge SPEC`` with the judge
    metrics that fit the data set's ratings."""
    names = sorted({m for d in dataset.dimensions for m in JUDGE_FITS.get(d.rating, ())})
    transcripts = folder / f"{dataset.key}.judge.jsonl"
    out = folder / f"{dataset.key}.judge.scores.jsonl"
    with open(transcripts, "w", encoding="utf-8") as fh:
        for item in dataset.items:
            row = {"conversation_id": item.id, "messages": item.messages}
            if item.metadata:
                row["metadata"] = item.metadata
            fh.write(json.dumps(row) + "\n")
    cmd = [sys.executable, "-m", "convsim", "score", str(transcripts), "--metrics"]
    cmd += [",".join(names), "--judge", spec, "--judge-samples", str(samples)]
    for arg in judge_args:
        cmd += ["--judge-arg", arg]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1) or not out.exists():
        raise SystemExit(
            f"convsim score --judge failed on {dataset.key} (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:] or proc.stdout[-3000:]}"
        )
    rows = (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line)
    return {row["conversation_id"]: row["scores"] for row in rows}


def auroc_ci(scores: Sequence[float], low: Sequence[int]) -> tuple[float, float, float] | None:
    """AUROC of ``-scores`` for telling the low-rated items (``low`` 1) apart, and a
    seeded bootstrap 95% interval; None without both kinds."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    x, y = np.asarray(scores, dtype=float), np.asarray(low)
    if len(set(y.tolist())) < 2:
        return None
    auc = float(roc_auc_score(y, -x))
    rng, drawn = np.random.default_rng(0), []
    for _ in range(1000):
        pick = rng.integers(0, len(y), len(y))
        if len(set(y[pick].tolist())) == 2:
            drawn.append(roc_auc_score(y[pick], -x[pick]))
    lo, hi = np.percentile(drawn, [2.5, 97.5])
    return auc, float(lo), float(hi)


def judge_agreement(
    datasets: list[Dataset],
    offline: dict[str, dict[str, dict[str, Any]]],
    spec: str,
    judge_args: Sequence[str],
    samples: int,
) -> None:
    """Per data set and rating: Spearman (95% CI) and AUROC for the low-rated half
    (rating below the median; bootstrap CI) of each fitting judge metric, beside the
    primary offline scorer, and the judge's sample counts (unparsable, failed)."""
    print(f"\n== Judge metrics with --judge {spec} (samples {samples}) ==")
    with tempfile.TemporaryDirectory(prefix="convsim-agreement-judge-") as tmp:
        for d in datasets:
            if not any(JUDGE_FITS.get(dim.rating) for dim in d.dimensions):
                continue
            started = time.perf_counter()
            judged = run_judge_score(d, Path(tmp), spec, judge_args, samples)
            elapsed = time.perf_counter() - started
            print(f"\n  -- {d.title}: {len(d.items)} items judged in {elapsed:.1f} s")
            counts: Counter[str] = Counter()
            for row in judged.values():
                for name, score in row.items():
                    details = score.get("details") or {}
                    for key in ("asked", "graded", "unparsable", "failed"):
                        counts[f"{name} {key}"] += int(details.get(f"samples_{key}") or 0)
            variants = RESPONSE_VARIANTS if d.level == "response" else DIALOGUE_VARIANTS
            primary = next(v for v in variants if v.primary)
            for dim in d.dimensions:
                for name in JUDGE_FITS.get(dim.rating, ()):
                    _print_judge_row(d, dim, name, judged, offline[d.key], primary)
            for name in sorted({k.rsplit(" ", 1)[0] for k in counts}):
                print(
                    f"     {name}: samples {counts[name + ' asked']} asked, "
                    f"{counts[name + ' graded']} graded, {counts[name + ' unparsable']} "
                    f"unparsable, {counts[name + ' failed']} failed"
                )


def _print_judge_row(
    d: Dataset,
    dim: Dimension,
    name: str,
    judged: dict[str, dict[str, Any]],
    offline: dict[str, dict[str, Any]],
    primary: Variant,
) -> None:
    items = [i for i in d.items if i.ratings.get(dim.rating) is not None]
    ys = [i.ratings[dim.rating] for i in items]
    for label, xs in (
        (name, [_value(name)(judged.get(i.id, {}), i) for i in items]),
        (f"(offline) {primary.name}", [primary.extract(offline[i.id], i) for i in items]),
    ):
        c = correlate(xs, ys)
        if c.rho is None:
            print(f"     {dim.rating:<20} {label[:60]:<60} n={c.n:<5} n/a: {c.why}")
            continue
        ci = c.rho_ci()
        pairs = [(float(x), y) for x, y in zip(xs, ys, strict=True) if isinstance(x, (int, float))]
        median = sorted(y for _, y in pairs)[len(pairs) // 2]
        auc = auroc_ci([x for x, _ in pairs], [int(y < median) for _, y in pairs])
        auc_text = f"AUROC {auc[0]:.2f} [{auc[1]:.2f}, {auc[2]:.2f}]" if auc else "AUROC n/a"
        ci_text = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "[n/a]"
        print(
            f"     {dim.rating:<20} {label[:60]:<60} n={c.n:<5} rho {c.rho:+.3f} {ci_text}  "
            + auc_text
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="folder with usr/, fed/, grade/, holistic/")
    parser.add_argument("--limit", type=int, default=None, help="at most N items per data set")
    parser.add_argument(
        "--judge",
        default=None,
        metavar="SPEC",
        help="also score with the conversational judge metrics, graded by this model "
        "(an adapter spec, as convsim's --judge)",
    )
    parser.add_argument(
        "--judge-arg", action="append", default=[], metavar="KEY=VALUE", help="as convsim's"
    )
    parser.add_argument("--judge-samples", type=int, default=1, help="grades per unit")
    args = parser.parse_args(argv)
    root = args.data_dir.expanduser().resolve()
    if not root.is_dir():
        raise SystemExit(f"{root}: not a folder")
    if args.limit is not None and args.limit < 3:
        raise SystemExit("--limit must be at least 3")

    started = time.perf_counter()
    datasets: list[Dataset] = []
    for load in (load_usr, load_fed, load_grade, load_holistic):
        datasets.extend(load(root))
    for d in datasets:
        d.items = spread(d.items, args.limit)

    nli_model = os.environ.get("CONVSIM_NLI_MODEL", "")
    if nli_model and not Path(nli_model).expanduser().is_dir():
        raise SystemExit(f"CONVSIM_NLI_MODEL={nli_model}: not a folder (give a model folder)")
    print(f"convsim agreement benchmark: data {root}")
    print(
        "backends: pattern (consistency, context_retention), WordLlama (coherence), "
        + (
            f"NLI {nli_model} (<metric>@nli: {NLI_METRICS})"
            if nli_model
            else "no NLI (set CONVSIM_NLI_MODEL to a model folder to add it)"
        )
    )
    print(
        f"python {sys.version.split()[0]}; scored with: python -m convsim score FILE "
        f"--metrics {METRICS} --out SCORES"
    )
    with (
        tempfile.TemporaryDirectory(prefix="convsim-agreement-") as tmp,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        results = list(pool.map(lambda d: run_score(d, Path(tmp)), datasets))
        nli_results = (
            list(pool.map(lambda d: run_score(d, Path(tmp), nli=True), datasets))
            if nli_model
            else []
        )
    all_scores = {d.key: s for d, (s, _) in zip(datasets, results, strict=True)}
    for d, (_, elapsed) in zip(datasets, results, strict=True):
        print(f"  {d.key}: {len(d.items)} transcripts scored in {elapsed:.1f} s")
    for d, (nli_scores, elapsed) in zip(datasets, nli_results, strict=False):
        for conversation_id, row in nli_scores.items():
            all_scores[d.key][conversation_id].update(row)
        print(f"  {d.key}: {len(d.items)} transcripts scored with the NLI model in {elapsed:.1f} s")

    comparisons: list[Comparison] = []
    for d in datasets:
        print(f"\n== {d.title}: {len(d.items)} {d.level}-level items ==")
        print(f"   transcript: {d.how}")
        comparisons.extend(evaluate(d, all_scores[d.key]))

    if args.limit is None:
        learned_lodo(datasets, all_scores)
    for d in datasets:
        if d.key == "fed-dialog":
            contradiction_auroc(d, all_scores[d.key])
            if nli_model:
                contradiction_auroc(d, all_scores[d.key], "consistency@nli")
    if args.judge is not None:
        judge_agreement(datasets, all_scores, args.judge, args.judge_arg, args.judge_samples)
    applicability(all_scores)
    text = summary(comparisons, retention_status(all_scores))
    if args.limit is not None:
        text += f" (Run with --limit {args.limit}: small samples, indicative only.)"
    print("\n" + text)
    print(f"\n(total wall time {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
