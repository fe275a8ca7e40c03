"""The ZRE member: the node, its peers, its event stream and its faces for threads."""
