# evaluation_engine/core/metrics_engine.py

from custom_metrics import CustomMetricsEngine

class MetricsEngine:
    def __init__(self):
        self.custom_engine = CustomMetricsEngine()
        
    def calculate_metric(self, metric_name: str, *args, **kwargs):
        """Calculate a specific metric."""
        if hasattr(self.custom_engine, f"calculate_{metric_name}"):
            return getattr(self.custom_engine, f"calculate_{metric_name}")(*args, **kwargs)
        elif metric_name in self.custom_engine.custom_metrics:
            return self.custom_engine.custom_metrics[metric_name](*args, **kwargs)
        else:
            raise ValueError(f"Unknown metric: {metric_name}")
