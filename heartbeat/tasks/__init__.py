"""The verbs on a task (new, set, add, claim, block, done, verify) and the handoff between tasks."""
