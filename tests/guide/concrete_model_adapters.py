# evaluation_engine/core/concrete_model_adapters.py

from custom_model_adapter import CustomModelAdapter
from convsim.adapters import ModelConfiguration

# Register the adapter
MODEL_ADAPTERS = {
    # ... existing adapters ...
    "custom": CustomModelAdapter,
}

def get_model_adapter(model_type: str, config: ModelConfiguration):
    """Get appropriate model adapter for the given type."""
    if model_type not in MODEL_ADAPTERS:
        raise ValueError(f"Unsupported model type: {model_type}")
        
    return MODEL_ADAPTERS[model_type](config)
