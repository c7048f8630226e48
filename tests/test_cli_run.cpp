// `strata run` and `strata chat` end to end, through the built executable: text streams to stdout,
// the stats line goes to stderr, the token-id path still works, and every mistake a person can make
// (missing file, not a GGUF, unsupported architecture, no tokenizer, prompt longer than the context)
// fails with one line that says what to do. Uses the fixture model with a byte-level tokenizer
// (tests/text_model_fixture.h); the bundled model's tests run once models/strata-tiny.gguf exists.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/writer.h"
#include "strata/text/chat_template.h"
#include "strata/text/tokenizer.h"
#include "cli_runner.h"
#include "text_model_fixture.h"

using namespace strata;
using strata::testing_cli::RunResult;
using strata::testing_cli::run_cli;
using strata::testing_cli::run_shell;
namespace fs = std::filesystem;

namespace {

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// "prompt: N tok, X tok/s | decode: M tok, Y tok/s | ttft: Z ms" -> N, M (or -1, -1).
std::pair<int, int> parse_stats(const std::string& line) {
  static const std::regex re(R"(prompt: (\d+) tok, [0-9.]+ tok/s \| decode: (\d+) tok, [0-9.]+ tok/s \| ttft: \d+ ms)");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

std::vector<std::pair<int, int>> all_stats(const std::string& err) {
  std::vector<std::pair<int, int>> out;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (auto s = parse_stats(line); s.first >= 0) out.push_back(s);
  return out;
}

class CliRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_path_ = new std::string(testing_fixture::make_text_model("test_cli_run_model"));
    plain_path_ = new std::string(testing_fixture::make_text_model("test_cli_run_plain", false));
  }
  static void TearDownTestSuite() {
    delete model_path_;
    delete plain_path_;
  }
  static std::string* model_path_;
  static std::string* plain_path_;
};
std::string* CliRun::model_path_ = nullptr;
std::string* CliRun::plain_path_ = nullptr;

TEST_F(CliRun, GreedyTextIsTheDecodedGreedyContinuation) {
  // Token healing re-chooses the prompt's last token (tested in test_token_healing); off here so the
  // reference is the plain greedy continuation of the whole prompt.
  const RunResult r = run_cli("run -m " + *model_path_ + " 'def f(x):' -n 12 --temp 0 --no-token-healing");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Reference: the engine's greedy loop, decoded here, up to the first end-of-generation token.
  auto model = Model::load(*model_path_);
  const Tokenizer tok(vocab_from_gguf(model->file()));
  const std::vector<int32_t> prompt = tok.encode("def f(x):");
  Session s(*model, 64);
  std::vector<int32_t> ids = generate_greedy(s, prompt, 12);
  for (size_t i = 0; i < ids.size(); ++i)
    if (tok.is_end_of_generation(ids[i])) {
      ids.resize(i);
      break;
    }
  std::string expected = tok.decode(ids, true);
  if (expected.empty() || expected.back() != '\n') expected += '\n';  // run ends the line
  EXPECT_EQ(r.out, expected);
  const auto stats = all_stats(r.err);
  ASSERT_EQ(stats.size(), 1u) << r.err;
  EXPECT_EQ(stats[0].first, static_cast<int>(prompt.size()));
  EXPECT_GE(stats[0].second, 1);
  EXPECT_LE(stats[0].second, 12);

  const RunResult quiet = run_cli("run -m " + *model_path_ + " 'def f(x):' -n 12 --temp 0 --no-stats --no-token-healing");
  EXPECT_EQ(quiet.exit_code, 0);
  EXPECT_EQ(quiet.out, r.out);
  EXPECT_TRUE(all_stats(quiet.err).empty()) << quiet.err;
}

TEST_F(CliRun, PromptFromStdin) {
  const RunResult a = run_cli("run -m " + *model_path_ + " 'def f(x):' -n 6 --temp 0");
  const RunResult b = run_cli("run -m " + *model_path_ + " - -n 6 --temp 0 < /dev/stdin", "printf 'def f(x):' |");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
}

TEST_F(CliRun, SeededSamplingIsReproducible) {
  const std::string args = "run -m " + *model_path_ + " 'hello' -n 16 --temp 1.0 --top-p 1 --seed 7 --no-stats";
  const RunResult a = run_cli(args), b = run_cli(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST_F(CliRun, TokenIdPathStillPrintsIds) {
  const RunResult r = run_cli("run -m " + *plain_path_ + " --prompt-tokens 1,2,3 -n 5 --temp 0 --print-token-ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto model = Model::load(*plain_path_);
  Session s(*model, 8);
  const std::vector<int32_t> ids = generate_greedy(s, {1, 2, 3}, 5);
  std::string expected;
  for (size_t i = 0; i < ids.size(); ++i) expected += cat(i ? "," : "", ids[i]);
  EXPECT_EQ(r.out, expected + "\n");
}

// One line on stderr, "strata: error: ...", containing every expected fragment; exit code 1.
void expect_clear_error(const RunResult& r, const std::vector<std::string>& fragments) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "missing '" << f << "' in: " << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliRun, ActionableErrors) {
  const std::string dir = (fs::path(STRATA_BINARY_DIR) / "test_tmp").string();
  expect_clear_error(run_cli("run -m " + dir + "/no_such_model.gguf hello"), {"not found", "no_such_model.gguf"});

  const std::string not_gguf = dir + "/test_cli_run_not_gguf.gguf";
  std::ofstream(not_gguf) << "this is a text file, not a model\n";
  expect_clear_error(run_cli("run -m " + not_gguf + " hello"), {"not a GGUF", not_gguf});

  const std::string llama = dir + "/test_cli_run_llama.gguf";
  {
    GgufWriter w;
    w.set("general.architecture", GgufValue::str("llama"));
    w.write(llama);
  }
  expect_clear_error(run_cli("run -m " + llama + " hello"), {"unsupported architecture", "llama", "qwen3moe"});

  expect_clear_error(run_cli("run -m " + *plain_path_ + " hello"), {"no tokenizer", "--prompt-tokens"});

  // "hello world" is 11 byte tokens with this tokenizer.
  expect_clear_error(run_cli("run -m " + *model_path_ + " 'hello world' --ctx 4"),
                     {"prompt of 11 tokens exceeds the context of 4", "--ctx"});

  expect_clear_error(run_cli("run -m " + *model_path_ + " ''"), {"no prompt"});
  expect_clear_error(run_cli("chat -m " + *plain_path_ + " < /dev/null"), {"no tokenizer"});

  // --gpu on a machine (or build) without a usable GPU: one line saying why, never a silent CPU run.
  // CUDA_VISIBLE_DEVICES= hides any GPU, so this holds on the GPU machine too.
  expect_clear_error(run_cli("run -m " + *model_path_ + " hello --gpu", "CUDA_VISIBLE_DEVICES="), {"--gpu:"});
}

TEST_F(CliRun, ChatAnswersEachLineAndExits) {
  const RunResult r = run_cli("chat -m " + *model_path_ + " --temp 0 -n 6 < /dev/stdin", "printf 'hello\\nagain\\n/exit\\nignored\\n' |");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto stats = all_stats(r.err);
  ASSERT_EQ(stats.size(), 2u) << r.err;  // two replies, nothing after /exit
  EXPECT_EQ(count_lines(r.out), 2) << r.out;  // each reply ends its line; no "> " prompt off a terminal
  // The first turn's prompt is the rendered conversation, counted here independently.
  auto model = Model::load(*model_path_);
  const Tokenizer tok(vocab_from_gguf(model->file()));
  const std::string first = render_chat({ChatMessage{"user", "hello", {}, "", "", std::nullopt}}, nullptr, {});
  EXPECT_EQ(stats[0].first, static_cast<int>(tok.encode(first).size()));

  // End of input without /exit also ends the chat cleanly.
  const RunResult eof = run_cli("chat -m " + *model_path_ + " --temp 0 -n 4 < /dev/stdin", "printf 'hi\\n' |");
  EXPECT_EQ(eof.exit_code, 0) << eof.err;
  EXPECT_EQ(all_stats(eof.err).size(), 1u) << eof.err;
}

TEST_F(CliRun, ChatTooLongTurnIsRefusedAndTheChatGoesOn) {
  const std::string longline(300, 'x');
  const RunResult r = run_cli("chat -m " + *model_path_ + " --ctx 64 --temp 0 -n 4 < /dev/stdin",
                              "printf '" + longline + "\\nhi\\n' |");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("exceeds the context of 64"), std::string::npos) << r.err;
  EXPECT_EQ(all_stats(r.err).size(), 1u) << r.err;  // the second line still got a reply
}

// The Ctrl-C tests run a shell script that sends SIGINT only once generation is visibly under way
// (waitfor polls a condition, at most 60 s), never on a timer that a busy machine could outrun.
// A watchdog kills strata after 120 s, so a broken interrupt fails the test instead of hanging it
// (not `timeout`: it relays only the first SIGINT to its child).
const char* kWatchdog = "(sleep 120; kill -KILL $pid) >/dev/null 2>&1 &\nwd=$!\n";

RunResult run_script(const std::string& name, const std::string& body) {
  const std::string path = cat(::testing::TempDir(), "/strata_cli_run_", name, "_", ::getpid(), ".sh");
  std::ofstream(path) << "waitfor() { n=0; while ! eval \"$1\" && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; }\n"
                      << "d=$(mktemp -d)\n"
                      << body << "kill $wd 2>/dev/null\ncat $d/err >&2\nrm -r $d\n";
  const RunResult r = run_shell("sh " + path);
  std::remove(path.c_str());
  return r;
}

TEST_F(CliRun, InterruptStopsRunWithExitCode130) {
  // A long generation, interrupted once text is flowing: stats still printed, exit code 130.
  const RunResult r = run_script("int_run", cat(STRATA_CLI, " run -m ", *model_path_,
                                                " hello -n 20000 --ctx 20100 --temp 0 > $d/out 2> $d/err &\n",
                                                "pid=$!\n", kWatchdog,
                                                "waitfor '[ -s $d/out ]'\n",
                                                "kill -INT $pid\n",
                                                "wait $pid\n",
                                                "echo rc=$?\n"));
  EXPECT_NE(r.out.find("rc=130"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(all_stats(r.err).size(), 1u) << r.err;
}

TEST_F(CliRun, InterruptInChatStopsTheReplyOnly) {
  // Ctrl-C during each of two replies: both stop, the chat reads the next line, /exit leaves with 0.
  const RunResult r = run_script("int_chat", cat("mkfifo $d/in\n",
                                                 STRATA_CLI, " chat -m ", *model_path_,
                                                 " --temp 0 -n 20000 --ctx 20100 < $d/in > $d/out 2> $d/err &\n",
                                                 "pid=$!\n", kWatchdog,
                                                 "exec 3> $d/in\n",
                                                 "echo hello >&3\n",
                                                 "waitfor '[ -s $d/out ]'\n",
                                                 "kill -INT $pid\n",
                                                 "waitfor 'grep -q interrupted $d/err'\n",
                                                 "s=$(wc -c < $d/out)\n",
                                                 "echo again >&3\n",
                                                 "waitfor '[ $(wc -c < $d/out) -gt $((s + 1)) ]'\n",
                                                 "kill -INT $pid\n",
                                                 "waitfor '[ $(grep -c interrupted $d/err) -ge 2 ]'\n",
                                                 "echo /exit >&3\n",
                                                 "exec 3>&-\n",
                                                 "wait $pid\n",
                                                 "echo rc=$?\n"));
  EXPECT_NE(r.out.find("rc=0"), std::string::npos) << r.out << r.err;
  size_t interrupted = 0;
  for (size_t at = r.err.find("(reply interrupted)"); at != std::string::npos; at = r.err.find("(reply interrupted)", at + 1))
    ++interrupted;
  EXPECT_EQ(interrupted, 2u) << r.err;
  EXPECT_EQ(all_stats(r.err).size(), 2u) << r.err;
}

// ---- the bundled model (models/strata-tiny.gguf) ---------------------------------------------

std::string bundled_model() { return std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf"; }

TEST(CliRunBundled, DefaultModelCompletesCode) {
  if (!fs::exists(bundled_model())) GTEST_SKIP() << bundled_model() << " is not in the tree yet";
  const RunResult r = run_cli("run 'def fibonacci(n):' -n 32 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(r.out.size(), 5u) << r.out;
  const auto stats = all_stats(r.err);
  ASSERT_EQ(stats.size(), 1u) << r.err;
  EXPECT_GT(stats[0].second, 0);
}

TEST(CliRunBundled, ChatRepliesAndReusesTheCache) {
  if (!fs::exists(bundled_model())) GTEST_SKIP() << bundled_model() << " is not in the tree yet";
  const RunResult r = run_cli("chat --temp 0 -n 24 < /dev/stdin", "printf 'hello\\nwhat is 2+2?\\n/exit\\n' |");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto stats = all_stats(r.err);
  ASSERT_EQ(stats.size(), 2u) << r.err;
  EXPECT_GT(r.out.size(), 2u);
  // The second turn feeds only what is new: fewer tokens than the first turn plus its reply.
  EXPECT_LT(stats[1].first, stats[0].first + stats[0].second) << r.err;
}

// On a terminal (a pseudo-terminal from script(1)) the turns are marked: the user's prompt, and a
// labelled line opening each reply, which ends with a blank line. Off a terminal stdout holds the
// replies alone (ChatAnswersEachLineAndExits).
TEST(CliRunBundled, ChatMarksTurnsOnATerminal) {
  if (!fs::exists(bundled_model())) GTEST_SKIP() << bundled_model() << " is not in the tree yet";
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is not installed";
  const RunResult r = strata::testing_cli::run_shell("printf 'hello\\nagain\\n/exit\\n' | script -qec '" + std::string(STRATA_CLI) +
                                                     " chat --temp 0 -n 6 --no-stats' /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = r.out.find(what); at != std::string::npos; at = r.out.find(what, at + 1)) ++n;
    return n;
  };
  const std::string prompt = "\x1b[1;32m>\x1b[0m ", reply = "\x1b[1;36massistant:\x1b[0m";
  EXPECT_EQ(count(prompt), 3) << r.out;  // before "hello", "again" and "/exit"
  EXPECT_EQ(count(reply), 2) << r.out;
  // prompt, reply, prompt, reply, prompt, in that order (the terminal's echo of the input may fall anywhere).
  size_t at = 0;
  for (const std::string& mark : {prompt, reply, prompt, reply, prompt}) {
    at = r.out.find(mark, at);
    ASSERT_NE(at, std::string::npos) << r.out;
    at += mark.size();
  }
  EXPECT_GE(count("\r\n\r\n"), 2) << r.out;  // a blank line ends each reply
}

}  // namespace

// ---- llama.cpp spellings and the thread policy (bundled model) -----------------------------------

namespace {

void need_bundled() {
  if (!fs::exists(bundled_model())) GTEST_SKIP() << bundled_model() << " is not in the tree yet";
}

TEST(CliFamiliarFlags, RunTakesLlamaCppSpellings) {
  need_bundled();
  const RunResult r = run_cli("run -p 'def add(a, b):' -n 4 -c 64 -t 1 -s 7 --temp 0 -ngl 0 -no-cnv --no-stats");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  // The same prompt from a file.
  const std::string file = cat(::testing::TempDir(), "/strata_prompt_", ::getpid(), ".txt");
  std::ofstream(file) << "def add(a, b):";
  const RunResult f = run_cli("run -f " + file + " -n 4 --temp 0 --no-stats");
  std::remove(file.c_str());
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.out, r.out);
  // A prompt given twice is refused.
  EXPECT_EQ(run_cli("run 'x' -p 'y' -n 1").exit_code, 1);
}

TEST(CliFamiliarFlags, NglIsReadAsGpuLayersNotAsN) {
  need_bundled();
  // Before, "-ngl 99" parsed as "-n gl" and failed on "gl"; now it asks for the GPU, which this build or
  // machine may lack: either it runs or it fails naming --gpu, never "gl".
  const RunResult r = run_cli("run -p 'x' -n 1 -ngl 99 --no-stats");
  EXPECT_EQ(r.err.find("could not be converted"), std::string::npos) << r.err;
  if (r.exit_code != 0) {
    EXPECT_NE(r.err.find("--gpu"), std::string::npos) << r.err;
  }
  const RunResult both = run_cli("run -p 'x' -n 1 -ngl 0 --gpu");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("-ngl 0"), std::string::npos) << both.err;
  // -ngld (the draft model's -ngl) is its own flag, not -ngl with a "d"; it needs a draft model.
  const RunResult d = run_cli("run -p 'x' -n 1 -ngld 0 --spec ngram --no-stats");
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_NE(d.err.find("-ngld"), std::string::npos) << d.err;
  const RunResult cpu_draft = run_cli("run -p 'def f' -n 4 --temp 0 -md " + bundled_model() + " -ngld 0 --no-stats");
  EXPECT_EQ(cpu_draft.exit_code, 0) << cpu_draft.err;
  EXPECT_NE(cpu_draft.err.find("(cpu)"), std::string::npos) << cpu_draft.err;
}

TEST(CliFamiliarFlags, EveryCommandDefaultsToTheBundledModel) {
  need_bundled();
  EXPECT_EQ(run_cli("tokenize --text hello").exit_code, 0);
  const std::string out = cat(::testing::TempDir(), "/strata_logits_", ::getpid(), ".bin");
  const RunResult l = run_cli("logits --tokens 1,2,3 --out " + out);
  EXPECT_EQ(l.exit_code, 0) << l.err;
  EXPECT_GT(fs::file_size(out), 0u);
  std::remove(out.c_str());
  const RunResult b = run_cli("bench -p 8 -n 4 -r 1 --triad-mib 1");
  EXPECT_EQ(b.exit_code, 0) << b.err;
}

TEST(CliFamiliarFlags, ServeTakesLlamaCppSpellingsAndValidatesThePort) {
  need_bundled();
  // The flags parse (the port check, after them, is what stops it).
  const RunResult r = run_cli("serve -c 64 -t 1 -np 1 -a foo --port 99999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--port must be 0..65535"), std::string::npos) << r.err;
  EXPECT_EQ(run_cli("serve --ctx-size 64 --threads 1 --parallel 1 --alias foo --port -1").exit_code, 1);
  // --cors takes '*' or scheme://host[:port]: a path or a line break (header injection) is refused.
  for (const char* bad : {"localhost", "http://x/path", "'http://x\r\nSet-Cookie: a=b'"}) {
    const RunResult c = run_cli(std::string("serve -c 64 --cors ") + bad);
    EXPECT_EQ(c.exit_code, 1) << bad;
    EXPECT_NE(c.err.find("--cors must be"), std::string::npos) << bad << ": " << c.err;
  }
}

TEST(CliFamiliarFlags, ConvertRefusesToOverwriteItsInput) {
  const std::string dir = cat(::testing::TempDir(), "/strata_convert_in_", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir + "/model.safetensors") << "weights";
  std::ofstream(dir + "/config.json") << "{}";
  for (const std::string& target : {dir + "/model.safetensors", dir + "/config.json", dir}) {
    const RunResult r = run_cli("convert --hf " + dir + " -o " + target);
    EXPECT_EQ(r.exit_code, 1) << target;
    EXPECT_NE(r.err.find("is one of its inputs"), std::string::npos) << r.err;
  }
  std::ifstream in(dir + "/model.safetensors");
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "weights");
  fs::remove_all(dir);
}

TEST(CliThreads, ThreadsAboveTheCoresWarnsAndIsCappedUnlessForced) {
  need_bundled();
  const RunResult capped = run_cli("run -p 'x' -n 1 --threads 4096 --no-stats");
  EXPECT_EQ(capped.exit_code, 0) << capped.err;
  EXPECT_NE(capped.err.find("--threads 4096 is more than"), std::string::npos) << capped.err;
  const RunResult forced = run_cli("run -p 'x' -n 1 --threads 3 --threads-force --no-stats");
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.err.find("warning"), std::string::npos) << forced.err;
}

}  // namespace
