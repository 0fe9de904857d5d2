"""Load testing: multi-turn sessions against a model server, measured like a serving
benchmark.

:func:`run_load` runs a whole test from a :class:`LoadPlan` (what ``convsim load``
does); :func:`drive` offers a workload to an adapter in one event loop; a
:class:`StopRequest` ends either early, keeping what was measured. The pieces:

- arrival schedules computed in advance (:func:`arrival_schedule`, :func:`read_trace`);
- token-count and think-time distributions (:func:`parse_distribution`) and synthetic
  workloads (:func:`parse_synthetic`);
- latency statistics over raw, mergeable samples (:class:`Samples`, :func:`summarize`);
- SLOs and goodput (:func:`parse_slos`, vLLM's form :func:`parse_goodput`,
  :func:`goodput`);
- workloads: synthetic sessions, scenario packs, ShareGPT files and ``datasets``
  datasets, Mooncake traces (:class:`Workload`, :func:`read_mooncake`);
- per-request records (:class:`RequestRecord`) and the versioned JSON result
  (:func:`point_result`, :func:`sweep_result`, :class:`LoadResult`).

Names are imported on first use, so ``import convsim.load`` costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._arrivals import ARRIVAL_PATTERNS as ARRIVAL_PATTERNS
    from ._arrivals import ArrivalPattern as ArrivalPattern
    from ._arrivals import Schedule as Schedule
    from ._arrivals import arrival_schedule as arrival_schedule
    from ._arrivals import read_trace as read_trace
    from ._calibrate import Calibration as Calibration
    from ._calibrate import calibrate as calibrate
    from ._distributions import AnyDistribution as AnyDistribution
    from ._distributions import Distribution as Distribution
    from ._distributions import Exponential as Exponential
    from ._distributions import Fixed as Fixed
    from ._distributions import LogNormal as LogNormal
    from ._distributions import Normal as Normal
    from ._distributions import SyntheticWorkload as SyntheticWorkload
    from ._distributions import Uniform as Uniform
    from ._distributions import parse_distribution as parse_distribution
    from ._distributions import parse_synthetic as parse_synthetic
    from ._driver import DriveOutcome as DriveOutcome
    from ._driver import LoadShape as LoadShape
    from ._driver import SessionRecord as SessionRecord
    from ._driver import drive as drive
    from ._driver import open_schedule as open_schedule
    from ._figures import Thresholds as Thresholds
    from ._figures import merged_result as merged_result
    from ._monitor import Progress as Progress
    from ._mooncake import MooncakeSessions as MooncakeSessions
    from ._mooncake import MooncakeTrace as MooncakeTrace
    from ._mooncake import read_mooncake as read_mooncake
    from ._plan import LoadPlan as LoadPlan
    from ._plan import LoadRun as LoadRun
    from ._plan import run_load as run_load
    from ._records import RequestRecord as RequestRecord
    from ._requests_file import write_requests as write_requests
    from ._result import SCHEMA_VERSION as SCHEMA_VERSION
    from ._result import ClientFigures as ClientFigures
    from ._result import ConversationFigures as ConversationFigures
    from ._result import InputTokenAccuracy as InputTokenAccuracy
    from ._result import LatencyMs as LatencyMs
    from ._result import LoadResult as LoadResult
    from ._result import PointResult as PointResult
    from ._result import RequestCounts as RequestCounts
    from ._result import SweepResult as SweepResult
    from ._result import Throughput as Throughput
    from ._result import TimelineEntry as TimelineEntry
    from ._result import TurnFigures as TurnFigures
    from ._result import TurnLatency as TurnLatency
    from ._result import Window as Window
    from ._result import point_result as point_result
    from ._result import sweep_result as sweep_result
    from ._slo import SLO as SLO
    from ._slo import Goodput as Goodput
    from ._slo import SLOMetric as SLOMetric
    from ._slo import SLOs as SLOs
    from ._slo import SLOStatistic as SLOStatistic
    from ._slo import goodput as goodput
    from ._slo import merge_objectives as merge_objectives
    from ._slo import parse_goodput as parse_goodput
    from ._slo import parse_slos as parse_slos
    from ._stats import LatencySummary as LatencySummary
    from ._stats import Samples as Samples
    from ._stats import summarize as summarize
    from ._stop import NothingMeasured as NothingMeasured
    from ._stop import StopRequest as StopRequest
    from ._workloads import PackSessions as PackSessions
    from ._workloads import SessionScript as SessionScript
    from ._workloads import ShareGPTSessions as ShareGPTSessions
    from ._workloads import SyntheticSessions as SyntheticSessions
    from ._workloads import TokenText as TokenText
    from ._workloads import TurnScript as TurnScript
    from ._workloads import Workload as Workload
    from ._workloads import read_sharegpt as read_sharegpt

__getattr__, __dir__ = _lazy_module(__name__, globals())
