# evaluation_engine/plugins/plugin_manager.py

from typing import Dict, List, Type
from convsim.plugins import BasePlugin
from convsim.plugins import CodeAnalysisPlugin

class PluginManager:
    """
    Manages plugin registration and lifecycle.
    """
    
    def __init__(self):
        self.plugins: Dict[str, BasePlugin] = {}
        self.plugin_registry: Dict[str, Type[BasePlugin]] = {
            "code_analysis": CodeAnalysisPlugin,
        }
        
    def register_plugin(self, name: str, plugin_class: Type[BasePlugin]):
        """Register a new plugin class."""
        self.plugin_registry[name] = plugin_class
        
    def load_plugin(self, name: str, config: Dict = None) -> bool:
        """Load and initialize a plugin."""
        if name not in self.plugin_registry:
            raise ValueError(f"Unknown plugin: {name}")
            
        plugin_class = self.plugin_registry[name]
        plugin_instance = plugin_class(config)
        
        if plugin_instance.initialize():
            self.plugins[name] = plugin_instance
            return True
        else:
            return False
            
    def unload_plugin(self, name: str):
        """Unload a plugin."""
        if name in self.plugins:
            self.plugins[name].cleanup()
            del self.plugins[name]
            
    def get_plugin(self, name: str) -> BasePlugin:
        """Get a loaded plugin."""
        return self.plugins.get(name)
        
    def list_available_plugins(self) -> List[str]:
        """List all available plugins."""
        return list(self.plugin_registry.keys())
        
    def list_loaded_plugins(self) -> List[str]:
        """List all loaded plugins."""
        return list(self.plugins.keys())
