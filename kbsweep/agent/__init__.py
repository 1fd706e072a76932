"""The agent stage: a model works a problem in a workspace through tools until it stops."""
