"""Other libraries' edges: the Hub, vLLM on the CPU and the process group at exit."""
