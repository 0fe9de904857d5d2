# The developer guide's "Step 5: Register Task" (lm_eval/tasks/single_turn_scenarios/
# my_new_task/__init__.py), as it is.

from .my_new_task import MyNewTask

# Task is automatically registered via the @register_task decorator
