"""_engine.gpu."""
