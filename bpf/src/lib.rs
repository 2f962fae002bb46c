//! The XDP program that steers the stack's traffic to AF_XDP sockets, and its loader.
