#include "strata/serve/http_guard.h"

#include <fcntl.h>
#include <cerrno>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "strata/serve/api_error.h"

namespace strata::serve {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

thread_local Connection* t_connection = nullptr;

// The library keeps its listening socket and its per-connection processing private; the guard needs
// both to run the accept loop itself. An explicit instantiation may name private members (the
// language exempts it from access checks), which hands their addresses to this one place. Called on
// a plain httplib::Server, the processing is the library's own.
using ProcessSocket = bool (httplib::Server::*)(socket_t);
using ListenSocket = std::atomic<socket_t> httplib::Server::*;
ProcessSocket process_member();
ListenSocket listen_member();
template <ProcessSocket P, ListenSocket L>
struct PrivateMembers {
  friend ProcessSocket process_member() { return P; }
  friend ListenSocket listen_member() { return L; }
};
template struct PrivateMembers<&httplib::Server::process_and_close_socket, &httplib::Server::svr_sock_>;

// Connections beyond the cap get this long to send their request line and headers.
constexpr auto kOverflowDeadline = 2s;
// Overflow connections kept at once; more are closed unanswered (each costs only a descriptor).
constexpr size_t kOverflowMax = 4096;
constexpr size_t kOverflowHeadMax = 8192;

std::string status_line(int status) {
  switch (status) {
    case 200: return "200 OK";
    case 503: return "503 Service Unavailable";
    default: return std::to_string(status) + " Error";
  }
}

void answer_and_close(int fd, int status, const std::string& body, bool retry_after) {
  std::string out = "HTTP/1.1 " + status_line(status) + "\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n" + (retry_after ? "Retry-After: 1\r\n" : "") +
                    "\r\n" + body;
  // Small enough for the socket's buffer: one non-blocking send; a client that cannot take it is dropped.
  (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

}  // namespace

Connection* current_connection() { return t_connection; }

void Connection::request_read() {
  std::lock_guard<std::mutex> lock(owner->mutex_);
  armed = false;
}

void Connection::answer_written() {
  if (close_after_answer_) {
    ::shutdown(watch_fd, SHUT_RDWR);
    return;
  }
  // The library waits keep_alive_s for the next request; then that request has the whole deadline.
  owner->rearm(*this, Clock::now() + std::chrono::seconds(owner->opt_.keep_alive_s + owner->opt_.request_deadline_s));
}

bool Connection::client_gone() const {
  pollfd p{watch_fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return ::recv(watch_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

HttpGuard::HttpGuard(httplib::Server& server, GuardOptions options) : server_(server), opt_(std::move(options)) {
  watchdog_ = std::thread([this] { watchdog(); });
}

HttpGuard::~HttpGuard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  for (const Overflow& o : overflow_) ::close(o.fd);
}

void HttpGuard::stop() { stop_requested_.store(true); }

void HttpGuard::rearm(Connection& c, Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    c.deadline = deadline;
    c.armed = true;
  }
  cv_.notify_all();
}

bool HttpGuard::listen() {
  const int lfd = (server_.*listen_member()).load();
  if (lfd < 0) return false;
  // One thread per connection under the cap (blocked on I/O, not busy).
  httplib::ThreadPool pool(static_cast<size_t>(opt_.max_connections));
  bool ok = true;
  while (!stop_requested_.load()) {
    pollfd p{lfd, POLLIN, 0};
    ::poll(&p, 1, overflow_.empty() ? 100 : 10);
    if (!overflow_.empty()) overflow_step();
    if (!(p.revents & POLLIN)) continue;
    const int sock = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (sock < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(10ms);  // out of descriptors: connections end, descriptors free up
        continue;
      }
      ok = false;
      break;
    }
    if (active_.load() >= opt_.max_connections) {
      if (overflow_.size() >= kOverflowMax) {
        ::close(sock);
        continue;
      }
      ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
      overflow_.push_back({sock, Clock::now() + kOverflowDeadline, {}});
      continue;
    }
    active_.fetch_add(1);
    pool.enqueue([this, sock] { serve(sock); });
  }
  ::shutdown(lfd, SHUT_RDWR);
  ::close(lfd);
  (server_.*listen_member()).store(INVALID_SOCKET);  // kept-alive connections end after their answer
  pool.shutdown();
  return ok;
}

void HttpGuard::serve(int sock) {
  Connection c;
  c.owner = this;
  c.watch_fd = ::dup(sock);
  c.deadline = Clock::now() + std::chrono::seconds(opt_.request_deadline_s);
  if (c.watch_fd >= 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_.push_back(&c);
  }
  cv_.notify_all();
  t_connection = &c;
  try {
    (server_.*process_member())(sock);  // closes sock
  } catch (...) {
  }
  t_connection = nullptr;
  if (c.watch_fd >= 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_.erase(std::find(watched_.begin(), watched_.end(), &c));
    ::close(c.watch_fd);
  }
  active_.fetch_sub(1);
}

void HttpGuard::watchdog() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + 1s;
    for (Connection* c : watched_) {
      if (!c->armed) continue;
      if (c->deadline <= now) {
        // The blocked read returns; the library closes the connection.
        ::shutdown(c->watch_fd, SHUT_RDWR);
        c->armed = false;
      } else {
        next = std::min(next, c->deadline);
      }
    }
    cv_.wait_until(lock, next);
  }
}

void HttpGuard::overflow_step() {
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < overflow_.size();) {
    Overflow& o = overflow_[i];
    char buf[2048];
    bool done = false;
    for (;;) {
      const ssize_t n = ::recv(o.fd, buf, sizeof buf, 0);
      if (n > 0) {
        o.head.append(buf, static_cast<size_t>(n));
        if (o.head.size() > kOverflowHeadMax) break;
        continue;
      }
      if (n == 0) done = true;  // the client closed
      break;
    }
    const bool complete = o.head.find("\r\n\r\n") != std::string::npos || o.head.size() > kOverflowHeadMax;
    if (complete) {
      if (o.head.rfind("GET /health ", 0) == 0 && opt_.health) {
        const auto [status, body] = opt_.health();
        answer_and_close(o.fd, status, body, status == 503);
      } else {
        answer_and_close(o.fd, 503,
                         error_body(503, "server_overloaded", "too many connections; retry later", "", "too_many_connections"),
                         true);
      }
      done = true;
    } else if (done || o.deadline <= now) {
      ::close(o.fd);
      done = true;
    }
    if (done) {
      overflow_[i] = overflow_.back();
      overflow_.pop_back();
    } else {
      ++i;
    }
  }
}

}  // namespace strata::serve
