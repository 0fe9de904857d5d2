# evaluation_engine/core/custom_metrics.py

from convsim.lm_eval import MetricsEngine
from typing import List, Dict, Any
import numpy as np
from sklearn.metrics.pairwise import cosine_similarity
import re

class CustomMetricsEngine(MetricsEngine):
    """
    Extended metrics engine with custom domain-specific metrics.
    """
    
    def __init__(self):
        super().__init__()
        self.register_custom_metrics()
        
    def register_custom_metrics(self):
        """Register custom metrics."""
        self.custom_metrics = {
            "domain_expertise_score": self.calculate_domain_expertise,
            "technical_accuracy": self.calculate_technical_accuracy,
            "code_security_score": self.calculate_code_security,
            "financial_reasoning": self.calculate_financial_reasoning,
            "conversation_flow": self.calculate_conversation_flow
        }
        
    def calculate_domain_expertise(self, response: str, reference: str, domain: str) -> float:
        """
        Calculate domain expertise score based on terminology usage and accuracy.
        """
        domain_terms = self.get_domain_terminology(domain)
        
        # Count domain-specific terms used correctly
        correct_terms = 0
        total_terms = len(domain_terms)
        
        for term in domain_terms:
            if term.lower() in response.lower():
                # Check if term is used in correct context
                if self.validate_term_usage(term, response, domain):
                    correct_terms += 1
                    
        expertise_score = correct_terms / total_terms if total_terms > 0 else 0.0
        
        # Adjust score based on overall response quality
        quality_multiplier = self.assess_response_quality(response, reference)
        
        return min(expertise_score * quality_multiplier, 1.0)
        
    def calculate_technical_accuracy(self, response: str, reference: str, context: Dict) -> float:
        """
        Calculate technical accuracy for code or technical content.
        """
        accuracy_score = 0.0
        
        # Check for syntax errors (if code)
        if self.is_code_content(response):
            if self.validate_syntax(response, context.get("language", "python")):
                accuracy_score += 0.3
                
        # Check for logical correctness
        if self.validate_logic(response, reference):
            accuracy_score += 0.4
            
        # Check for best practices
        if self.check_best_practices(response, context):
            accuracy_score += 0.3
            
        return accuracy_score
        
    def calculate_code_security_score(self, code: str, language: str = "python") -> float:
        """
        Calculate security score for code snippets.
        """
        security_issues = []
        security_score = 1.0
        
        # Common security patterns to check
        security_patterns = {
            "sql_injection": r"(SELECT|INSERT|UPDATE|DELETE).*\+.*['\"]",
            "command_injection": r"(os\.system|subprocess\.call|exec|eval)\s*\(",
            "hardcoded_secrets": r"(password|api_key|secret)\s*=\s*['\"][^'\"]+['\"]",
            "unsafe_deserialization": r"(pickle\.loads|yaml\.load)\s*\(",
            "path_traversal": r"\.\./",
        }
        
        for issue_type, pattern in security_patterns.items():
            if re.search(pattern, code, re.IGNORECASE):
                security_issues.append(issue_type)
                security_score -= 0.2
                
        return max(security_score, 0.0)
        
    def calculate_financial_reasoning(self, response: str, context: Dict) -> float:
        """
        Calculate financial reasoning quality for quantitative finance tasks.
        """
        reasoning_score = 0.0
        
        # Check for key financial concepts
        financial_concepts = [
            "risk", "return", "volatility", "correlation", "diversification",
            "sharpe ratio", "alpha", "beta", "portfolio", "hedge"
        ]
        
        concept_coverage = sum(
            1 for concept in financial_concepts 
            if concept in response.lower()
        ) / len(financial_concepts)
        
        reasoning_score += concept_coverage * 0.3
        
        # Check for quantitative analysis
        if self.contains_quantitative_analysis(response):
            reasoning_score += 0.3
            
        # Check for risk considerations
        if self.mentions_risk_factors(response):
            reasoning_score += 0.2
            
        # Check for practical implementation
        if self.includes_implementation_details(response):
            reasoning_score += 0.2
            
        return reasoning_score
        
    def calculate_conversation_flow(self, conversation_turns: List[Dict]) -> float:
        """
        Calculate conversation flow quality for multi-turn scenarios.
        """
        if len(conversation_turns) < 2:
            return 0.0
            
        flow_score = 0.0
        
        # Check topic consistency
        topic_consistency = self.calculate_topic_consistency(conversation_turns)
        flow_score += topic_consistency * 0.4
        
        # Check response relevance
        relevance_score = self.calculate_response_relevance(conversation_turns)
        flow_score += relevance_score * 0.3
        
        # Check progression quality
        progression_score = self.calculate_progression_quality(conversation_turns)
        flow_score += progression_score * 0.3
        
        return flow_score
        
    # Helper methods
    
    def get_domain_terminology(self, domain: str) -> List[str]:
        """Get domain-specific terminology."""
        domain_terms = {
            "finance": [
                "portfolio", "risk", "return", "volatility", "correlation",
                "diversification", "alpha", "beta", "sharpe ratio", "var"
            ],
            "programming": [
                "algorithm", "complexity", "optimization", "refactoring",
                "debugging", "testing", "deployment", "scalability"
            ],
            "machine_learning": [
                "model", "training", "validation", "overfitting", "feature",
                "accuracy", "precision", "recall", "cross-validation"
            ]
        }
        
        return domain_terms.get(domain, [])
        
    def validate_term_usage(self, term: str, response: str, domain: str) -> bool:
        """Validate if a term is used correctly in context."""
        # Simplified validation - in practice, this would be more sophisticated
        term_context = self.extract_term_context(term, response)
        return len(term_context) > 10  # Basic check for meaningful context
        
    def extract_term_context(self, term: str, text: str) -> str:
        """Extract context around a term."""
        import re
        pattern = rf".{{0,50}}{re.escape(term)}.{{0,50}}"
        match = re.search(pattern, text, re.IGNORECASE)
        return match.group(0) if match else ""
        
    def is_code_content(self, content: str) -> bool:
        """Check if content appears to be code."""
        code_indicators = [
            "def ", "class ", "import ", "from ", "if ", "for ", "while ",
            "{", "}", "(", ")", "=", "==", "!=", "<=", ">="
        ]
        
        return any(indicator in content for indicator in code_indicators)
        
    def validate_syntax(self, code: str, language: str) -> bool:
        """Validate code syntax."""
        try:
            if language.lower() == "python":
                compile(code, '<string>', 'exec')
                return True
        except SyntaxError:
            return False
        except:
            pass
            
        return False  # Conservative approach for other languages
        
    def validate_logic(self, response: str, reference: str) -> bool:
        """Validate logical correctness."""
        # Simplified logic validation
        # In practice, this would involve more sophisticated analysis
        return len(response.strip()) > 0 and "error" not in response.lower()
        
    def check_best_practices(self, response: str, context: Dict) -> bool:
        """Check for best practices."""
        # Simplified best practices check
        best_practices = [
            "documentation", "error handling", "validation", "testing"
        ]
        
        return any(practice in response.lower() for practice in best_practices)
