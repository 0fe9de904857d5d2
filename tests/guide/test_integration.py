# tests/test_integration.py

import pytest
from convsim.client import EvaluationClient
from convsim.adapters import get_model_adapter
from convsim.adapters import ModelConfiguration

class TestIntegration:
    """Integration tests for custom extensions."""
    
    def setup_method(self):
        """Set up integration test environment."""
        self.client = EvaluationClient(
            base_url="http://localhost:8000",
            api_key="test-key"
        )
        
    @pytest.mark.integration
    def test_custom_task_evaluation(self):
        """Test evaluation with custom task."""
        evaluation = self.client.create_evaluation(
            models=[{
                "model_id": "openai/gpt-3.5-turbo",
                "model_type": "openai",
                "config": {"temperature": 0.0}
            }],
            tasks=["single_turn_scenarios_my_new_task"]
        )
        
        assert evaluation.id is not None
        assert evaluation.status in ["queued", "running"]
        
    @pytest.mark.integration
    def test_custom_model_adapter(self):
        """Test custom model adapter."""
        config = ModelConfiguration({
            "api_endpoint": "http://localhost:8080",
            "api_key": "test-key",
            "model_name": "custom-model"
        })
        
        adapter = get_model_adapter("custom", config)
        assert adapter is not None
        
        model_info = adapter.get_model_info()
        assert model_info["model_type"] == "custom"
        
    @pytest.mark.integration
    def test_plugin_loading(self):
        """Test plugin loading and usage."""
        from convsim.plugins import PluginManager
        
        manager = PluginManager()
        success = manager.load_plugin("code_analysis")
        assert success is True
        
        plugin = manager.get_plugin("code_analysis")
        assert plugin is not None
        
        # Test plugin functionality
        result = plugin.process(
            {"code": "def hello(): print('Hello, World!')"},
            {"language": "python"}
        )
        
        assert "syntax" in result
        assert result["syntax"]["valid"] is True
