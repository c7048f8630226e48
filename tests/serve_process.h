// Helpers for the tests that run `strata serve` as a child process: raw HTTP over loopback sockets,
// the server process (its port, readiness, exit) and the Node client scripts of tests/serve/.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
const std::string kSource = STRATA_SOURCE_DIR;
const std::string kModel = kSource + "/models/strata-tiny.gguf";
const std::string kNodeModules = kSource + "/build-data/node/node_modules";

bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

// A port nothing listens on now and that this process has not handed out before: servers started one
// after another are given their ports before any of them binds, and the kernel may offer a port just
// released again (two servers on one port: the second fails to listen, and a test waiting for it
// would talk to the first).
int free_port() {
  static std::set<int> given;
  for (;;) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    close(s);
    const int port = ntohs(a.sin_port);
    if (given.insert(port).second) return port;
  }
}

int connect_to(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

bool send_all(int s, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = send(s, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes or `timeout` passes.
std::string read_all(int s, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  char buf[8192];
  while (Clock::now() < deadline) {
    pollfd p{s, POLLIN, 0};
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (poll(&p, 1, std::max(1, left)) <= 0) break;
    const ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct HttpResult {
  int status = 0;
  std::string head, body;
};

HttpResult parse_response(const std::string& raw) {
  HttpResult r;
  const size_t end = raw.find("\r\n\r\n");
  r.head = raw.substr(0, end);
  if (end != std::string::npos) r.body = raw.substr(end + 4);
  if (raw.rfind("HTTP/1.1 ", 0) == 0) r.status = std::atoi(raw.c_str() + 9);
  return r;
}

// One request on its own connection ("Connection: close"), the raw bytes of the body as given.
HttpResult http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                const std::string& extra_headers = "", std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const int s = connect_to(port);
  if (s < 0) return {};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  send_all(s, req);
  HttpResult r = parse_response(read_all(s, timeout));
  close(s);
  return r;
}

std::string run_capture(const std::string& cmd, int& exit_code) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) {
    exit_code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

class ServerProcess {
 public:
  // stderr_path: where the server's stderr goes ("" : inherited); port < 0: a free one.
  explicit ServerProcess(std::vector<std::string> extra, const std::string& stderr_path = "", int port = -1)
      : port_(port < 0 ? free_port() : port) {
    std::vector<std::string> args = {STRATA_CLI, "serve", "-m", kModel, "--port", std::to_string(port_), "--model-name", "tiny"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      if (!stderr_path.empty()) {
        FILE* f = std::freopen(stderr_path.c_str(), "w", stderr);
        (void)f;
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool wait_ready(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (http(port_, "GET", "/health", "", "", std::chrono::seconds(2)).status == 200) return true;
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // Sends SIGTERM; returns the exit code, or -1 when it did not exit within `limit`.
  int terminate(std::chrono::seconds limit = std::chrono::seconds(30)) {
    kill(pid_, SIGTERM);
    return wait_exit(limit);
  }
  long rss_kib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    return -1;
  }
  int port() const { return port_; }
  void set_port(int port) { port_ = port; }
  // Waits for the process to exit; its exit code, or -1 when it still runs after `limit`.
  int wait_exit(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  bool alive() { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  int port_;
  pid_t pid_ = -1;
};

[[maybe_unused]] std::string node_script(const ServerProcess& s, const std::string& script, const std::string& args) {
  return "STRATA_NODE_MODULES='" + kNodeModules + "' node '" + kSource + "/tests/serve/" + script + "' " + s.base_url() + " " + args;
}

}  // namespace
