"""What an agent's own call loads: the pulse of a touch and the relay client. A test pins its imports."""
