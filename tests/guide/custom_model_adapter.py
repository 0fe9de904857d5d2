# evaluation_engine/core/custom_model_adapter.py

from convsim.adapters import ModelAdapter
from convsim.adapters import ModelConfiguration
import requests
import json

class CustomModelAdapter(ModelAdapter):
    """
    Adapter for custom model backend.
    """
    
    def __init__(self, config: ModelConfiguration):
        super().__init__(config)
        self.api_endpoint = config.get("api_endpoint")
        self.api_key = config.get("api_key")
        self.model_name = config.get("model_name")
        
    def get_model_info(self):
        """Return model information."""
        return {
            "model_id": f"custom/{self.model_name}",
            "model_type": "custom",
            "provider": "custom_provider",
            "capabilities": ["text_generation", "code_generation"],
            "context_length": 4096,
            "supports_streaming": True
        }
        
    def generate_response(self, prompt: str, config: dict = None) -> dict:
        """Generate response from the custom model."""
        
        # Prepare request
        request_data = {
            "model": self.model_name,
            "prompt": prompt,
            "max_tokens": config.get("max_tokens", 1024),
            "temperature": config.get("temperature", 0.7),
            "top_p": config.get("top_p", 1.0),
            "stop": config.get("stop", [])
        }
        
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "Content-Type": "application/json"
        }
        
        try:
            # Make API request
            response = requests.post(
                f"{self.api_endpoint}/generate",
                headers=headers,
                json=request_data,
                timeout=30
            )
            response.raise_for_status()
            
            result = response.json()
            
            return {
                "text": result["choices"][0]["text"],
                "usage": {
                    "prompt_tokens": result.get("usage", {}).get("prompt_tokens", 0),
                    "completion_tokens": result.get("usage", {}).get("completion_tokens", 0),
                    "total_tokens": result.get("usage", {}).get("total_tokens", 0)
                },
                "model": self.model_name,
                "finish_reason": result["choices"][0].get("finish_reason", "stop")
            }
            
        except requests.exceptions.RequestException as e:
            raise Exception(f"Custom model API error: {str(e)}")
            
    def get_default_config(self):
        """Return default configuration for this model."""
        return {
            "temperature": 0.7,
            "max_tokens": 1024,
            "top_p": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0
        }
        
    def validate_config(self, config: dict):
        """Validate model configuration."""
        required_fields = ["api_endpoint", "api_key", "model_name"]
        
        for field in required_fields:
            if field not in config:
                return {
                    "valid": False,
                    "error": f"Missing required field: {field}"
                }
                
        # Validate parameter ranges
        if "temperature" in config:
            if not 0 <= config["temperature"] <= 2:
                return {
                    "valid": False,
                    "error": "Temperature must be between 0 and 2"
                }
                
        return {"valid": True}
        
    def estimate_cost(self, prompt_tokens: int, completion_tokens: int):
        """Estimate cost for the request."""
        # Implement cost calculation based on your pricing model
        prompt_cost = prompt_tokens * 0.0001  # Example: $0.0001 per token
        completion_cost = completion_tokens * 0.0002
        
        return {
            "prompt_cost": prompt_cost,
            "completion_cost": completion_cost,
            "total_cost": prompt_cost + completion_cost,
            "currency": "USD"
        }
        
    def get_rate_limits(self):
        """Return rate limit information."""
        return {
            "requests_per_minute": 60,
            "tokens_per_minute": 90000,
            "requests_per_day": 10000
        }
