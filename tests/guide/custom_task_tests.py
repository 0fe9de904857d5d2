# The developer guide's "Unit Testing Framework" (tests/test_custom_task.py), with only
# its import line changed: the guide's task installed as a package (tests/guide/installed).
# tests/test_custom_task.py

import pytest
from guide_extensions.my_new_task import MyNewTask

class TestMyNewTask:
    """Test suite for custom task implementation."""
    
    def setup_method(self):
        """Set up test fixtures."""
        self.task = MyNewTask()
        self.sample_doc = {
            "question": "What is the capital of France?",
            "expected_answer": "Paris",
            "context": "",
            "required_keywords": ["paris", "france"],
            "difficulty": "easy"
        }
        
    def test_doc_to_text(self):
        """Test document to text conversion."""
        text = self.task.doc_to_text(self.sample_doc)
        assert "What is the capital of France?" in text
        assert "Answer:" in text
        
    def test_doc_to_target(self):
        """Test target extraction."""
        target = self.task.doc_to_target(self.sample_doc)
        assert target == "Paris"
        
    def test_process_results_exact_match(self):
        """Test result processing with exact match."""
        results = ["Paris"]
        processed = self.task.process_results(self.sample_doc, results)
        
        assert processed["exact_match"] == 1.0
        assert processed["model_output"] == "Paris"
        assert processed["expected_answer"] == "Paris"
        
    def test_process_results_no_match(self):
        """Test result processing with no match."""
        results = ["London"]
        processed = self.task.process_results(self.sample_doc, results)
        
        assert processed["exact_match"] == 0.0
        assert processed["model_output"] == "London"
        
    def test_custom_quality_score(self):
        """Test custom quality scoring."""
        # Test with good response
        good_response = "Paris is the capital of France"
        score = self.task._calculate_quality_score(self.sample_doc, good_response)
        assert score > 0.5
        
        # Test with empty response
        empty_response = ""
        score = self.task._calculate_quality_score(self.sample_doc, empty_response)
        assert score < 0.5
        
    def test_aggregation_config(self):
        """Test aggregation configuration."""
        agg_config = self.task.aggregation()
        assert "exact_match" in agg_config
        assert "mean" in agg_config["exact_match"]
        
    def test_higher_is_better_config(self):
        """Test higher-is-better configuration."""
        hib_config = self.task.higher_is_better()
        assert hib_config["exact_match"] is True
        assert hib_config["custom_score"] is True
