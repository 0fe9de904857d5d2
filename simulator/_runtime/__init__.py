"""The runtime: the simulator, its run, the conversation actor and what they share."""
