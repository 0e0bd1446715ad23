"""Loading models and locating their parts (architecture knowledge lives in ``adapters``)."""
