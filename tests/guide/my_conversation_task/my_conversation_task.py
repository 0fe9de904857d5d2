# The developer guide's "Multi-Turn Task Implementation", Step 1, with only its import
# lines changed to convsim's.
# lm_eval/tasks/multi_turn_scenarios/my_conversation_task/my_conversation_task.py

from convsim.lm_eval import MultiTurnTask
from convsim.lm_eval import register_task
import yaml

@register_task("multi_turn_scenarios_my_conversation_task")
class MyConversationTask(MultiTurnTask):
    """
    Multi-turn conversation task for [specific domain].
    """
    
    VERSION = 1.0
    DATASET_PATH = "scenarios.jsonl"
    TURN_CONFIG_PATH = "turn_configs.yml"
    
    def __init__(self, config=None):
        super().__init__(config)
        self.load_turn_configurations()
        
    def load_turn_configurations(self):
        """Load turn-specific configurations."""
        with open(self.TURN_CONFIG_PATH, 'r') as f:
            self.turn_configs = yaml.safe_load(f)
            
    def test_docs(self):
        """Load conversation scenarios."""
        return self.dataset["test"]
        
    def get_conversation_flow(self, doc):
        """Define the conversation flow for this scenario."""
        scenario_type = doc.get("scenario_type", "default")
        return self.turn_configs.get(scenario_type, self.turn_configs["default"])
        
    def process_turn(self, doc, turn_config, conversation_history, turn_index):
        """Process a single turn in the conversation."""
        
        # Build context from conversation history
        context = self.build_conversation_context(conversation_history)
        
        # Generate prompt for this turn
        prompt = self.generate_turn_prompt(doc, turn_config, context, turn_index)
        
        # Get model response
        response = self.get_model_response(prompt, turn_config)
        
        # Evaluate turn
        turn_metrics = self.evaluate_turn(doc, turn_config, response, conversation_history)
        
        return {
            "turn_index": turn_index,
            "prompt": prompt,
            "response": response,
            "metrics": turn_metrics
        }
        
    def generate_turn_prompt(self, doc, turn_config, context, turn_index):
        """Generate prompt for a specific turn."""
        template = turn_config.get("prompt_template", "")
        
        # Fill in template variables
        prompt = template.format(
            context=context,
            scenario=doc.get("scenario_description", ""),
            turn_index=turn_index,
            **doc.get("variables", {})
        )
        
        return prompt
        
    def evaluate_turn(self, doc, turn_config, response, conversation_history):
        """Evaluate a single turn's response."""
        metrics = {}
        
        # Standard turn metrics
        metrics["response_length"] = len(response.split())
        metrics["relevance_score"] = self.calculate_relevance(response, doc)
        
        # Turn-specific metrics
        for metric_name in turn_config.get("evaluation_metrics", []):
            if hasattr(self, f"calculate_{metric_name}"):
                metrics[metric_name] = getattr(self, f"calculate_{metric_name}")(
                    response, doc, conversation_history
                )
                
        return metrics
        
    def evaluate_conversation(self, doc, conversation_turns):
        """Evaluate the entire conversation."""
        conversation_metrics = {}
        
        # Aggregate turn metrics
        turn_metrics = [turn["metrics"] for turn in conversation_turns]
        conversation_metrics.update(self.aggregate_turn_metrics(turn_metrics))
        
        # Conversation-level metrics
        conversation_metrics["context_retention"] = self.calculate_context_retention(
            conversation_turns
        )
        conversation_metrics["goal_achievement"] = self.calculate_goal_achievement(
            doc, conversation_turns
        )
        conversation_metrics["coherence_score"] = self.calculate_coherence(
            conversation_turns
        )
        
        return conversation_metrics
        
    def calculate_context_retention(self, conversation_turns):
        """Calculate how well context is retained across turns."""
        # Implement context retention calculation
        return 0.8  # Placeholder
        
    def calculate_goal_achievement(self, doc, conversation_turns):
        """Calculate how well the conversation achieved its goals."""
        # Implement goal achievement calculation
        return 0.7  # Placeholder
        
    def calculate_coherence(self, conversation_turns):
        """Calculate conversation coherence score."""
        # Implement coherence calculation
        return 0.9  # Placeholder
