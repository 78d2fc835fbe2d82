"""Engine settings: each declared once, how it reaches vLLM, and how its effective value is read back."""
