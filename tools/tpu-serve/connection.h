// tpu-serve's view of a request's TCP connection: httplib 0.11 gives a handler no handle on
// it, so a non-streaming request finds its socket among the process's descriptors and polls it
// while it waits for the engine (a client that went away is cancelled).
#pragma once

#include <httplib.h>

namespace tpu::serve_http {

// The socket of the request's connection, or -1 when not found (the request is then not polled).
int connection_of(const httplib::Request& req);
// The peer closed its side (or the connection was reset).
bool peer_gone(int sock);

}  // namespace tpu::serve_http
