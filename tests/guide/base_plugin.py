# evaluation_engine/plugins/base_plugin.py

from abc import ABC, abstractmethod
from typing import Dict, Any, List

class BasePlugin(ABC):
    """
    Base class for all evaluation engine plugins.
    """
    
    def __init__(self, config: Dict[str, Any] = None):
        self.config = config or {}
        self.name = self.__class__.__name__
        self.version = "1.0.0"
        
    @abstractmethod
    def initialize(self) -> bool:
        """Initialize the plugin. Return True if successful."""
        pass
        
    @abstractmethod
    def get_capabilities(self) -> List[str]:
        """Return list of capabilities this plugin provides."""
        pass
        
    @abstractmethod
    def process(self, data: Any, context: Dict[str, Any]) -> Any:
        """Process data with this plugin."""
        pass
        
    def cleanup(self):
        """Cleanup resources when plugin is unloaded."""
        pass
        
    def get_config_schema(self) -> Dict[str, Any]:
        """Return configuration schema for this plugin."""
        return {}
        
    def validate_config(self, config: Dict[str, Any]) -> bool:
        """Validate plugin configuration."""
        return True
