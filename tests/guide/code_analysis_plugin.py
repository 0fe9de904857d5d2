# evaluation_engine/plugins/code_analysis_plugin.py

from convsim.plugins import BasePlugin
from typing import Dict, Any, List
import ast
import subprocess
import tempfile
import os

class CodeAnalysisPlugin(BasePlugin):
    """
    Plugin for advanced code analysis and quality assessment.
    """
    
    def __init__(self, config: Dict[str, Any] = None):
        super().__init__(config)
        self.supported_languages = ["python", "javascript", "java"]
        self.analysis_tools = {}
        
    def initialize(self) -> bool:
        """Initialize code analysis tools."""
        try:
            # Initialize Python analysis tools
            self.analysis_tools["python"] = {
                "ast_parser": ast,
                "linter": "pylint",
                "formatter": "black"
            }
            
            # Check if external tools are available
            self._check_external_tools()
            
            return True
        except Exception as e:
            print(f"Failed to initialize CodeAnalysisPlugin: {e}")
            return False
            
    def get_capabilities(self) -> List[str]:
        """Return plugin capabilities."""
        return [
            "syntax_analysis",
            "complexity_analysis", 
            "style_analysis",
            "security_analysis",
            "performance_analysis"
        ]
        
    def process(self, data: Any, context: Dict[str, Any]) -> Any:
        """Analyze code and return quality metrics."""
        code = data.get("code", "")
        language = context.get("language", "python")
        
        if language not in self.supported_languages:
            return {"error": f"Unsupported language: {language}"}
            
        analysis_results = {}
        
        # Syntax analysis
        analysis_results["syntax"] = self._analyze_syntax(code, language)
        
        # Complexity analysis
        analysis_results["complexity"] = self._analyze_complexity(code, language)
        
        # Style analysis
        analysis_results["style"] = self._analyze_style(code, language)
        
        # Security analysis
        analysis_results["security"] = self._analyze_security(code, language)
        
        # Performance analysis
        analysis_results["performance"] = self._analyze_performance(code, language)
        
        return analysis_results
        
    def _analyze_syntax(self, code: str, language: str) -> Dict[str, Any]:
        """Analyze code syntax."""
        if language == "python":
            try:
                ast.parse(code)
                return {"valid": True, "errors": []}
            except SyntaxError as e:
                return {
                    "valid": False,
                    "errors": [{"line": e.lineno, "message": str(e)}]
                }
        
        return {"valid": True, "errors": []}  # Placeholder for other languages
        
    def _analyze_complexity(self, code: str, language: str) -> Dict[str, Any]:
        """Analyze code complexity."""
        if language == "python":
            try:
                tree = ast.parse(code)
                complexity_analyzer = PythonComplexityAnalyzer()
                return complexity_analyzer.analyze(tree)
            except:
                return {"cyclomatic_complexity": 0, "cognitive_complexity": 0}
                
        return {"cyclomatic_complexity": 0, "cognitive_complexity": 0}
        
    def _analyze_style(self, code: str, language: str) -> Dict[str, Any]:
        """Analyze code style."""
        style_issues = []
        
        if language == "python":
            # Check basic Python style guidelines
            lines = code.split('\n')
            
            for i, line in enumerate(lines, 1):
                # Line length check
                if len(line) > 88:
                    style_issues.append({
                        "line": i,
                        "type": "line_too_long",
                        "message": f"Line too long ({len(line)} > 88 characters)"
                    })
                    
                # Indentation check (simplified)
                if line.startswith(' ') and not line.startswith('    '):
                    if len(line) - len(line.lstrip()) % 4 != 0:
                        style_issues.append({
                            "line": i,
                            "type": "indentation",
                            "message": "Inconsistent indentation"
                        })
                        
        return {
            "issues": style_issues,
            "score": max(0, 1.0 - len(style_issues) * 0.1)
        }
        
    def _analyze_security(self, code: str, language: str) -> Dict[str, Any]:
        """Analyze code for security issues."""
        security_issues = []
        
        if language == "python":
            # Check for common security anti-patterns
            dangerous_patterns = [
                ("eval(", "Use of eval() is dangerous"),
                ("exec(", "Use of exec() is dangerous"),
                ("os.system(", "Use of os.system() can lead to command injection"),
                ("subprocess.call(", "Unsafe subprocess usage"),
                ("pickle.loads(", "Unsafe deserialization"),
            ]
            
            for pattern, message in dangerous_patterns:
                if pattern in code:
                    security_issues.append({
                        "type": "dangerous_function",
                        "pattern": pattern,
                        "message": message
                    })
                    
        return {
            "issues": security_issues,
            "score": max(0, 1.0 - len(security_issues) * 0.2)
        }
        
    def _analyze_performance(self, code: str, language: str) -> Dict[str, Any]:
        """Analyze code for performance issues."""
        performance_issues = []
        
        if language == "python":
            # Check for common performance anti-patterns
            if "for" in code and "append" in code:
                if code.count("append") > 5:
                    performance_issues.append({
                        "type": "inefficient_loop",
                        "message": "Consider using list comprehension"
                    })
                    
            if "+" in code and "str" in code:
                performance_issues.append({
                    "type": "string_concatenation",
                    "message": "Consider using join() for string concatenation"
                })
                
        return {
            "issues": performance_issues,
            "score": max(0, 1.0 - len(performance_issues) * 0.15)
        }
        
    def _check_external_tools(self):
        """Check availability of external analysis tools."""
        tools_to_check = ["pylint", "black", "mypy"]
        
        for tool in tools_to_check:
            try:
                subprocess.run([tool, "--version"], 
                             capture_output=True, check=True)
                print(f"✓ {tool} is available")
            except (subprocess.CalledProcessError, FileNotFoundError):
                print(f"✗ {tool} is not available")

class PythonComplexityAnalyzer(ast.NodeVisitor):
    """AST visitor for calculating Python code complexity."""
    
    def __init__(self):
        self.cyclomatic_complexity = 1  # Base complexity
        self.cognitive_complexity = 0
        
    def analyze(self, tree):
        """Analyze AST tree and return complexity metrics."""
        self.visit(tree)
        return {
            "cyclomatic_complexity": self.cyclomatic_complexity,
            "cognitive_complexity": self.cognitive_complexity
        }
        
    def visit_If(self, node):
        self.cyclomatic_complexity += 1
        self.cognitive_complexity += 1
        self.generic_visit(node)
        
    def visit_While(self, node):
        self.cyclomatic_complexity += 1
        self.cognitive_complexity += 1
        self.generic_visit(node)
        
    def visit_For(self, node):
        self.cyclomatic_complexity += 1
        self.cognitive_complexity += 1
        self.generic_visit(node)
