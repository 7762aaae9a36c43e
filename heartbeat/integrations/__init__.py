"""The agent CLIs' own seams: Claude Code and Codex hooks, and the MCP server."""
