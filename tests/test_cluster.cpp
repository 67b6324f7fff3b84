// Clusters: ClusterSpec and its JSON, TF_CONFIG, Slurm and launcher resolvers, multi-worker ids.
#define DISTRIBUTE_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_NET
#include <distribute/distribute.hpp>
#include <distribute/net/address.hpp>

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ds = distribute;

namespace {

struct BadCase {
  const char* name;
  const char* text;      // the input (TF_CONFIG, a hostlist...)
  const char* expected;  // a part of the message that names the field and the value
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Addresses

TEST_CASE("split_host_port accepts host:port, IPv4 and bracketed IPv6") {
  CHECK(ds::split_host_port("localhost:2222") == ds::HostPort{"localhost", 2222});
  CHECK(ds::split_host_port("10.0.0.7:1") == ds::HostPort{"10.0.0.7", 1});
  CHECK(ds::split_host_port("node-01.cluster_a:65535") == ds::HostPort{"node-01.cluster_a", 65535});
  CHECK(ds::split_host_port("[::1]:2222") == ds::HostPort{"::1", 2222});
  CHECK(ds::split_host_port("[fe80::1%eth0]:80") == ds::HostPort{"fe80::1%eth0", 80});
  CHECK(ds::split_host_port("[::ffff:10.0.0.1]:8") == ds::HostPort{"::ffff:10.0.0.1", 8});
  CHECK(ds::HostPort{"::1", 2222}.to_string() == "[::1]:2222");
  CHECK(ds::HostPort{"a", 1}.to_string() == "a:1");
}

TEST_CASE("split_host_port rejects malformed addresses, saying what is wrong") {
  const BadCase cases[] = {
      {"empty", "", "address '' is empty"},
      {"no port", "localhost", "address 'localhost' has no port"},
      {"empty port", "localhost:", "has an empty port"},
      {"empty host", ":2222", "address ':2222' has an empty host"},
      {"port zero", "a:0", "has port 0, out of range [1, 65535]"},
      {"port too big", "a:65536", "has port 65536, out of range"},
      {"huge port", "a:99999999999999999999", "out of range [1, 65535]"},
      {"port not a number", "a:http", "has port 'http', which is not a number"},
      {"signed port", "a:+80", "has port '+80', which is not a number"},
      {"unbracketed IPv6", "::1:2222", "IPv6 host without brackets"},
      {"scheme", "grpc://a:1", "has a scheme ('grpc://')"},
      {"unclosed bracket", "[::1:2222", "has an unclosed '['"},
      {"no port after bracket", "[::1]", "has no ':port' after ']'"},
      {"not IPv6 in brackets", "[host]:1", "has 'host' in brackets, which is not an IPv6 address"},
      {"space in host", "my host:1", "invalid character ' '"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::split_host_port(c.text), doctest::Contains(c.expected), ds::ClusterConfigError);
    CHECK_FALSE(ds::is_valid_address(c.text));
  }
  // A megabyte of input is quoted by its first bytes and its length, never whole.
  const std::string mega(std::size_t{1} << 20, '7');
  CHECK_THROWS_WITH_AS(ds::split_host_port("a:" + mega),
                       fmt::format("address 'a:{}...' (1048578 bytes) has port {}..., out of range [1, 65535]",
                                   std::string(62, '7'), std::string(20, '7'))
                           .c_str(),
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::split_host_port("a:x" + mega),
                       fmt::format("address 'a:x{}...' (1048579 bytes) has port 'x{}...' (1048577 bytes), which is not a number",
                                   std::string(61, '7'), std::string(63, '7'))
                           .c_str(),
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::split_host_port("grpc" + mega + "://a:1"),
                       doctest::Contains(fmt::format("has a scheme ('grpc{}...' ({} bytes))", std::string(60, '7'), mega.size() + 7).c_str()),
                       ds::ClusterConfigError);
}

// ---------------------------------------------------------------------------------------------
// ClusterSpec

TEST_CASE("ClusterSpec from dense jobs: jobs, tasks and addresses") {
  ds::ClusterSpec spec({{"worker", {"w0:2222", "w1:2222"}}, {"ps", {"p0:2222"}}, {"chief", {"c:2222"}}});
  CHECK(spec.jobs() == std::vector<std::string>{"chief", "ps", "worker"});
  CHECK(spec.num_tasks("worker") == 2);
  CHECK(spec.num_tasks("ps") == 1);
  CHECK(spec.task_address("worker", 1) == "w1:2222");
  CHECK(spec.task_indices("worker") == std::vector<int>{0, 1});
  CHECK(spec.job_tasks("worker") == std::vector<std::string>{"w0:2222", "w1:2222"});
  CHECK(spec.has_job("ps"));
  CHECK_FALSE(spec.has_job("evaluator"));
  CHECK(spec.has_task("worker", 1));
  CHECK_FALSE(spec.has_task("worker", 2));
  CHECK_FALSE(spec.empty());
  CHECK(ds::ClusterSpec().empty());
  CHECK(spec == ds::ClusterSpec({{"chief", {"c:2222"}}, {"ps", {"p0:2222"}}, {"worker", {"w0:2222", "w1:2222"}}}));
  CHECK_FALSE(spec == ds::ClusterSpec({{"worker", {"w0:2222", "w1:2222"}}}));
}

TEST_CASE("ClusterSpec sparse jobs: indices, job_tasks with gaps, TF's {\"0\": addr} JSON") {
  auto spec = ds::ClusterSpec::from_json(R"({"worker": {"0": "a:1", "3": "b:2"}, "ps": ["c:3"]})");
  CHECK(spec.num_tasks("worker") == 2);
  CHECK(spec.task_indices("worker") == std::vector<int>{0, 3});
  CHECK(spec.task_address("worker", 3) == "b:2");
  CHECK(spec.job_tasks("worker") == std::vector<std::string>{"a:1", "", "", "b:2"});
  CHECK(spec == ds::ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}, {"ps", {{0, "c:3"}}}}));
  CHECK(spec.to_json() == R"({"ps":["c:3"],"worker":{"0":"a:1","3":"b:2"}})");
  // A sparse job whose indices happen to be 0..n-1 is written as a list.
  CHECK(ds::ClusterSpec::from_json(R"({"worker": {"1": "b:2", "0": "a:1"}})").to_json() == R"({"worker":["a:1","b:2"]})");
}

TEST_CASE("ClusterSpec JSON round trip") {
  const char* texts[] = {
      R"({"worker":["localhost:12345","localhost:23456"]})",
      R"({"chief":["c:1"],"evaluator":["e:1"],"ps":["p:1","p:2"],"worker":["w:1","w:2","w:3"]})",
      R"({"ps":{"2":"p:2"},"worker":{"0":"w:10","5":"w:15"}})",
      R"({"worker":["[::1]:2222","[::1]:2223"]})",
      R"({})",
  };
  for (const char* text : texts) {
    INFO(std::string(text));
    auto spec = ds::ClusterSpec::from_json(text);
    CHECK(spec.to_json() == text);
    CHECK(ds::ClusterSpec::from_json(spec.to_json()) == spec);
    CHECK(ds::ClusterSpec::from_json(spec.to_json_value()) == spec);
  }
  auto value = boost::json::parse(R"({"worker": ["a:1"]})");
  CHECK(ds::ClusterSpec::from_json(value) == ds::ClusterSpec({{"worker", {"a:1"}}}));
}

TEST_CASE("ClusterSpec rejects malformed jobs, naming the job, task and address") {
  const BadCase cases[] = {
      {"syntax", R"({"worker": ["a:1",]})", "ClusterSpec: invalid JSON at offset 18: syntax error"},
      {"not an object", R"(["a:1"])", "ClusterSpec: the cluster JSON must be an object of job name → task addresses, got array"},
      {"job not a list", R"({"worker": "a:1"})", "ClusterSpec: worker must be a list"},
      {"address not a string", R"({"worker": ["a:1", 2]})", "ClusterSpec: worker[1] must be a \"host:port\" string, got number 2"},
      {"no port", R"({"worker": ["a:1", "b"]})", "ClusterSpec: worker[1] address 'b' has no port"},
      {"bad job name", R"({"1worker": ["a:1"]})", "ClusterSpec: job name '1worker' is not a valid name"},
      {"sparse key", R"({"worker": {"first": "a:1"}})", "ClusterSpec: worker has key 'first', which is not a task index"},
      {"duplicate", R"({"ps": ["a:1"], "worker": ["a:1"]})", "ClusterSpec: worker[0] address 'a:1' is already used by ps[0]"},
      {"index too large", R"({"worker": {"5000000": "a:1"}})", "ClusterSpec: worker has key '5000000'"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::ClusterSpec::from_json(c.text), doctest::Contains(c.expected), ds::ClusterConfigError);
  }
  CHECK_THROWS_WITH_AS(ds::ClusterSpec({{"worker", {"a:1", "a:70000"}}}),
                       "ClusterSpec: worker[1] address 'a:70000' has port 70000, out of range [1, 65535]", ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::ClusterSpec::from_sparse({{"worker", {{-1, "a:1"}}}}), doctest::Contains("worker[-1] has task index -1"),
                       ds::ClusterConfigError);
}

TEST_CASE("ClusterSpec lookups of absent jobs and tasks are InvalidArgument") {
  ds::ClusterSpec spec({{"worker", {"a:1", "b:1"}}});
  CHECK_THROWS_WITH_AS(spec.task_address("worker", 2), "ClusterSpec::task_address: job 'worker' has no task 2 (task indices: 0, 1)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(spec.num_tasks("ps"), "ClusterSpec::num_tasks: no job 'ps' in the cluster (jobs: worker)",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(spec.task_indices("ps"), ds::InvalidArgument);
  CHECK_THROWS_AS(ds::ClusterSpec().job_tasks("worker"), ds::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// TF_CONFIG

TEST_CASE("TF_CONFIG dict form: the tutorial's two workers") {
  ds::TFConfigClusterResolver r(
      R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 1}})");
  CHECK(r.has_tf_config());
  CHECK(r.cluster_spec() == ds::ClusterSpec({{"worker", {"localhost:12345", "localhost:23456"}}}));
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 1);
  CHECK(r.rpc_layer() == "");
  CHECK(r.environment() == "");
  CHECK(r.num_accelerators().empty());
  CHECK_FALSE(r.is_chief());
  CHECK(r.worker_count() == 2);
  CHECK(r.id_in_cluster() == 1);
  CHECK(r.master_address() == "localhost:12345");
  CHECK(r.global_replica_id(4, 3) == 7);

  ds::TFConfigClusterResolver w0(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(w0.is_chief());  // no chief job: worker 0 is the chief
  CHECK(w0.id_in_cluster() == 0);
}

TEST_CASE("TF_CONFIG sparse form") {
  ds::TFConfigClusterResolver r(R"({"cluster": {"ps": ["p:1"], "worker": {"0": "w0:1", "3": "w3:1"}},
                                    "task": {"type": "worker", "index": 3}})");
  CHECK(r.cluster_spec().task_indices("worker") == std::vector<int>{0, 3});
  CHECK(r.task_id() == 3);
  CHECK(r.id_in_cluster() == 3);  // TF's rule: the index, plus one if there is a chief
  CHECK(r.worker_count() == 2);
  CHECK(r.master_address() == "w0:1");
}

TEST_CASE("TF_CONFIG with chief, workers, ps and evaluator") {
  const std::string cluster =
      R"("cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222", "p1:2222"],
                     "evaluator": ["e:2222"]})";
  auto make = [&](const char* type, int index) {
    return ds::TFConfigClusterResolver(
        fmt::format(R"({{{}, "task": {{"type": "{}", "index": {}}}, "rpc_layer": "grpc", "environment": "cloud"}})", cluster,
                    type, index));
  };
  auto chief = make("chief", 0);
  CHECK(chief.is_chief());
  CHECK(chief.id_in_cluster() == 0);
  CHECK(chief.worker_count() == 3);
  CHECK(chief.master_address() == "c:2222");
  CHECK(chief.rpc_layer() == "grpc");
  CHECK(chief.environment() == "cloud");
  CHECK(chief.cluster_spec().jobs() == std::vector<std::string>{"chief", "evaluator", "ps", "worker"});

  auto w1 = make("worker", 1);
  CHECK_FALSE(w1.is_chief());
  CHECK(w1.id_in_cluster() == 2);
  CHECK(w1.worker_count() == 3);
  CHECK(w1.global_replica_id(2, 1) == 5);
  CHECK(w1.master_address() == "c:2222");

  auto w0 = make("worker", 0);
  CHECK_FALSE(w0.is_chief());  // there is a chief
  CHECK(w0.id_in_cluster() == 1);

  auto ps = make("ps", 1);
  CHECK(ps.task_type() == "ps");
  CHECK(ps.task_id() == 1);
  CHECK_FALSE(ps.is_chief());
  CHECK_THROWS_WITH_AS(ps.id_in_cluster(), doctest::Contains("task type 'ps' has no id in the cluster"), ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ps.worker_count(), doctest::Contains("task type 'ps' runs no replicas"), ds::ClusterConfigError);

  auto evaluator = make("evaluator", 0);
  CHECK(evaluator.is_chief());
  CHECK(evaluator.worker_count() == 1);
  CHECK_THROWS_WITH_AS(evaluator.id_in_cluster(), doctest::Contains("'evaluator' has no id"), ds::ClusterConfigError);
}

TEST_CASE("TF_CONFIG: evaluator may be absent from the cluster; extras are ignored; index may be a digit string") {
  ds::TFConfigClusterResolver eval(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}, "extra": [1, 2]})");
  CHECK(eval.task_type() == "evaluator");
  CHECK(eval.worker_count() == 1);

  ds::TFConfigClusterResolver str(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "1", "x": 0}})");
  CHECK(str.task_id() == 1);

  ds::TFConfigClusterResolver v6(R"({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(v6.master_address() == "[::1]:2222");
  CHECK(ds::split_host_port(v6.master_address()) == ds::HostPort{"::1", 2222});

  ds::TFConfigClusterResolver nulls(R"({"rpc_layer": null, "environment": null})");
  CHECK(nulls.cluster_spec().empty());
  CHECK(nulls.rpc_layer().empty());

  // An evaluator outside the cluster may have any index (TF's resolver reports it as given).
  ds::TFConfigClusterResolver eval3(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 3}})");
  CHECK(eval3.task_id() == 3);
  CHECK(eval3.is_chief());
}

TEST_CASE("TF_CONFIG: a task without a cluster is reported as given; the process is local mode's one worker") {
  // TF 2.21: {"task": {"type": "worker", "index": 2}} -> cluster {}, task_type 'worker', task_id 2, master ''.
  ds::TFConfigClusterResolver w2(R"({"task": {"type": "worker", "index": 2}})");
  CHECK(w2.cluster_spec().empty());
  CHECK(w2.task_type() == "worker");
  CHECK(w2.task_id() == 2);
  CHECK(w2.master() == "");
  CHECK(w2.is_chief());
  CHECK(w2.id_in_cluster() == 0);
  CHECK(w2.worker_count() == 1);
  ds::TFConfigClusterResolver ps(R"({"cluster": {}, "task": {"type": "ps", "index": 0}})");
  CHECK(ps.task_type() == "ps");
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(R"({"task": {"type": "worker", "index": -1}})"),
                       "TF_CONFIG: task.index -1 is negative", ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(R"({"task": {"type": "worker", "index": 1000000}})"),
                       "TF_CONFIG: task.index 1000000 is out of range (at most 999999)", ds::ClusterConfigError);
}

TEST_CASE("ClusterResolver::master follows TF's TFConfigClusterResolver.master()") {
  // Expected values: TF 2.21's TFConfigClusterResolver().master() for the same TF_CONFIG.
  ds::TFConfigClusterResolver grpc(
      R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})");
  CHECK(grpc.master() == "grpc://b:1");
  CHECK(grpc.master("worker", 0) == "grpc://a:1");
  CHECK(grpc.master("worker", 0, "") == "a:1");
  ds::TFConfigClusterResolver plain(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})");
  CHECK(plain.master() == "b:1");
  ds::TFConfigClusterResolver one(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"})");
  CHECK(one.master() == "");  // one task: nobody to connect to
  ds::TFConfigClusterResolver session(
      R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}, "session_master": "s:1"})");
  CHECK(session.master() == "s:1");
  CHECK(ds::TFConfigClusterResolver("").master() == "");
  ds::TFConfigClusterResolver eval(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "evaluator", "index": 0}})");
  CHECK_THROWS_WITH_AS(eval.master(), "ClusterResolver::master: job 'evaluator' is not in the cluster (jobs: worker)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(plain.master("worker", 5), doctest::Contains("job 'worker' has no task 5"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(R"({"session_master": 5})"),
                       "TF_CONFIG: session_master must be a string, got number 5", ds::ClusterConfigError);
}

TEST_CASE("TF_CONFIG missing, blank or {} means a single local worker") {
  std::vector<ds::TFConfigClusterResolver> resolvers;
  resolvers.emplace_back("");
  resolvers.emplace_back("  \n");
  resolvers.emplace_back("{}");
  resolvers.emplace_back(R"({"cluster": {}, "task": {"type": "worker", "index": 0}})");
  resolvers.emplace_back(ds::EnvVars{{"PATH", "/bin"}});
  for (const auto& r : resolvers) {
    CHECK(r.cluster_spec().empty());
    CHECK(r.task_type() == "worker");
    CHECK(r.task_id() == 0);
    CHECK(r.is_chief());
    CHECK(r.worker_count() == 1);
    CHECK(r.id_in_cluster() == 0);
    CHECK(r.master_address() == "");
  }
  CHECK_FALSE(resolvers[0].has_tf_config());
  CHECK_FALSE(resolvers[4].has_tf_config());
  CHECK(resolvers[2].has_tf_config());

  // The same variable read from an injected environment.
  ds::TFConfigClusterResolver from_env(
      ds::EnvVars{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})"}});
  CHECK(from_env.task_id() == 1);
  CHECK(from_env.cluster_spec().num_tasks("worker") == 2);
}

TEST_CASE("TF_CONFIG: explicit options override the task, rpc layer and environment") {
  const char* text = R"({"cluster": {"worker": ["a:1", "b:1", "c:1"]}, "task": {"type": "worker", "index": 0}})";
  ds::TFConfigClusterResolver r(text, {.task_type = "worker", .task_id = 2, .rpc_layer = "grpc", .environment = "google",
                                       .num_accelerators = {{"GPU", 2}}});
  CHECK(r.task_id() == 2);
  CHECK(r.rpc_layer() == "grpc");
  CHECK(r.environment() == "google");
  CHECK(r.num_accelerators() == ds::AcceleratorCounts{{"GPU", 2}});
  CHECK(r.global_replica_id(2, 1) == 5);

  ds::TFConfigOptions id3;
  id3.task_id = 3;
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(text, id3),
                       "TFConfigClusterResolver: task_id 3 is out of range for job 'worker' with 3 tasks", ds::ClusterConfigError);
  ds::TFConfigOptions ps;
  ps.task_type = "ps";
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(text, ps),
                       "TFConfigClusterResolver: task_type 'ps' has no job in cluster (jobs: worker)", ds::ClusterConfigError);
  // Without a cluster the overrides still name a task of it.
  ds::TFConfigOptions chief_only;
  chief_only.task_type = "chief";
  CHECK(ds::TFConfigClusterResolver("", chief_only).is_chief());
}

TEST_CASE("TF_CONFIG: malformed configurations throw ClusterConfigError naming the field") {
  const BadCase cases[] = {
      // JSON itself
      {"incomplete JSON", R"({"cluster": )", "TF_CONFIG: invalid JSON at offset 12: incomplete JSON"},
      {"syntax error", R"({"cluster": {"worker": ["a:1",]}})", "TF_CONFIG: invalid JSON at offset 30: syntax error"},
      {"extra data", R"({} x)", "TF_CONFIG: invalid JSON at offset 3: extra data"},
      {"top level array", R"([1])", "TF_CONFIG: the top level must be an object with cluster and task, got array"},
      // cluster
      {"cluster array", R"({"cluster": ["a:1"]})", "TF_CONFIG: cluster must be an object of job name → task addresses, got array"},
      {"cluster string", R"({"cluster": "a:1"})", "TF_CONFIG: cluster must be an object of job name → task addresses, got string \"a:1\""},
      {"job not a list", R"({"cluster": {"worker": "a:1"}})",
       "TF_CONFIG: cluster.worker must be a list of \"host:port\" addresses or an object of task index → address, got string \"a:1\""},
      {"address number", R"({"cluster": {"worker": ["a:1", 7]}})", "TF_CONFIG: cluster.worker[1] must be a \"host:port\" string, got number 7"},
      {"address null", R"({"cluster": {"worker": [null]}})", "TF_CONFIG: cluster.worker[0] must be a \"host:port\" string, got null"},
      {"no port", R"({"cluster": {"worker": ["localhost"]}})", "TF_CONFIG: cluster.worker[0] address 'localhost' has no port"},
      {"port zero", R"({"cluster": {"worker": ["a:1", "b:0"]}})", "TF_CONFIG: cluster.worker[1] address 'b:0' has port 0, out of range [1, 65535]"},
      {"port too big", R"({"cluster": {"ps": ["a:70000"]}})", "TF_CONFIG: cluster.ps[0] address 'a:70000' has port 70000"},
      {"port text", R"({"cluster": {"chief": ["a:grpc"]}})", "TF_CONFIG: cluster.chief[0] address 'a:grpc' has port 'grpc', which is not a number"},
      {"empty address", R"({"cluster": {"worker": [""]}})", "TF_CONFIG: cluster.worker[0] address '' is empty"},
      {"empty host", R"({"cluster": {"worker": [":2222"]}})", "TF_CONFIG: cluster.worker[0] address ':2222' has an empty host"},
      {"scheme", R"({"cluster": {"worker": ["grpc://a:1"]}})", "TF_CONFIG: cluster.worker[0] address 'grpc://a:1' has a scheme"},
      {"bare IPv6", R"({"cluster": {"worker": ["::1:2222"]}})", "TF_CONFIG: cluster.worker[0] address '::1:2222' has an IPv6 host without brackets"},
      {"bad IPv6", R"({"cluster": {"worker": ["[zz]:1"]}})", "TF_CONFIG: cluster.worker[0] address '[zz]:1' has 'zz' in brackets"},
      {"unknown job", R"({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}})",
       "TF_CONFIG: cluster has job 'master'; jobs must be chief, worker, ps or evaluator"},
      {"two chiefs", R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})",
       "TF_CONFIG: cluster.chief has 2 tasks; there can be at most one chief"},
      {"two evaluators", R"({"cluster": {"worker": ["w:1"], "evaluator": ["a:1", "b:1"]}})",
       "TF_CONFIG: cluster.evaluator has 2 tasks; there can be at most one evaluator"},
      {"sparse key", R"({"cluster": {"worker": {"a": "h:1"}}})", "TF_CONFIG: cluster.worker has key 'a', which is not a task index"},
      {"sparse negative key", R"({"cluster": {"worker": {"-1": "h:1"}}})", "TF_CONFIG: cluster.worker has key '-1'"},
      {"sparse address", R"({"cluster": {"worker": {"3": 5}}})", "TF_CONFIG: cluster.worker[3] must be a \"host:port\" string, got number 5"},
      {"duplicate address", R"({"cluster": {"chief": ["a:1"], "worker": ["b:1", "a:1"]}})",
       "TF_CONFIG: cluster.worker[1] address 'a:1' is already used by cluster.chief[0]"},
      // task
      {"task string", R"({"cluster": {"worker": ["a:1"]}, "task": "worker"})",
       "TF_CONFIG: task must be an object with type and index, got string \"worker\""},
      {"task missing", R"({"cluster": {"worker": ["a:1"]}})", "TF_CONFIG: task is missing"},
      {"type missing", R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})", "TF_CONFIG: task.type is missing"},
      {"type number", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": 1, "index": 0}})",
       "TF_CONFIG: task.type must be a string, got number 1"},
      {"type unknown", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}})",
       "TF_CONFIG: task.type 'master' is not a task type; expected chief, worker, ps or evaluator"},
      {"type empty", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "", "index": 0}})", "TF_CONFIG: task.type '' is not a task type"},
      {"type not in cluster", R"({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})",
       "TF_CONFIG: task.type 'ps' has no job in cluster (jobs: chief, worker)"},
      {"index missing", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})", "TF_CONFIG: task.index is missing"},
      {"index fraction", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1.5}})",
       "TF_CONFIG: task.index must be an integer, got number 1.5"},
      {"index word", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "one"}})",
       "TF_CONFIG: task.index must be an integer, got string \"one\""},
      {"index bool", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}})",
       "TF_CONFIG: task.index must be an integer, got bool true"},
      {"index negative", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})",
       "TF_CONFIG: task.index -1 is negative"},
      {"index out of range", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 3}})",
       "TF_CONFIG: task.index 3 is out of range for job 'worker' with 2 tasks"},
      {"index huge", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1000000000000}})",
       "TF_CONFIG: task.index 1000000000000 is out of range for job 'worker' with 2 tasks"},
      {"chief index 1", R"({"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 1}})",
       "TF_CONFIG: task.index 1 is out of range for job 'chief' with 1 task"},
      {"sparse index absent", R"({"cluster": {"worker": {"0": "a:1", "3": "b:1"}}, "task": {"type": "worker", "index": 2}})",
       "TF_CONFIG: task.index 2 is not a task of job 'worker' (task indices: 0, 3)"},
      {"absent evaluator huge index", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 1000000}})",
       "TF_CONFIG: task.index 1000000 is out of range (at most 999999)"},
      {"empty cluster, unknown type", R"({"task": {"type": "master", "index": 0}})",
       "TF_CONFIG: task.type 'master' is not a task type; expected chief, worker, ps or evaluator"},
      // null where TF raises: ClusterSpec(None), 'type' in None, int(None)
      {"cluster null", R"({"cluster": null})", "TF_CONFIG: cluster must be an object of job name → task addresses, got null"},
      {"task null", R"({"task": null})", "TF_CONFIG: task must be an object with type and index, got null"},
      {"index null", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": null}})",
       "TF_CONFIG: task.index must be an integer, got null"},
      {"type null", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": null, "index": 0}})",
       "TF_CONFIG: task.type must be a string, got null"},
      // other members
      {"rpc_layer number", R"({"rpc_layer": 5})", "TF_CONFIG: rpc_layer must be a string, got number 5"},
      {"environment array", R"({"environment": ["cloud"]})", "TF_CONFIG: environment must be a string, got array"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver{std::string_view(c.text)}, doctest::Contains(c.expected),
                         ds::ClusterConfigError);
  }
  // The message of the issue, exactly.
  CHECK_THROWS_WITH_AS(
      ds::TFConfigClusterResolver(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 3}})"),
      "TF_CONFIG: task.index 3 is out of range for job 'worker' with 2 tasks", ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0.5}})"),
                       "TF_CONFIG: task.index must be an integer, got number 0.5", ds::ClusterConfigError);
  // Every cluster error is a ds::Error.
  CHECK_THROWS_AS(ds::TFConfigClusterResolver("[]"), ds::Error);
}

// ---------------------------------------------------------------------------------------------
// SimpleClusterResolver and the multi-worker helpers

TEST_CASE("SimpleClusterResolver reports what it was given and checks the task") {
  ds::ClusterSpec spec({{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1", "w2:1"}}});
  ds::SimpleClusterResolver r(spec, "worker", 2);
  CHECK(r.cluster_spec() == spec);
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 2);
  CHECK(r.rpc_layer() == "grpc");
  CHECK(r.num_accelerators().empty());
  CHECK(r.worker_count() == 4);
  CHECK(r.id_in_cluster() == 3);
  CHECK(r.global_replica_id(3, 0) == 9);
  CHECK_FALSE(r.is_chief());
  CHECK(r.master_address() == "c:1");

  ds::SimpleClusterResolver c(spec, "chief", 0, "", {{"GPU", 4}});
  CHECK(c.is_chief());
  CHECK(c.num_accelerators() == ds::AcceleratorCounts{{"GPU", 4}});
  CHECK(c.rpc_layer() == "");

  // Custom job names are fine here; only TF_CONFIG restricts them.
  ds::SimpleClusterResolver custom(ds::ClusterSpec({{"trainer", {"t:1"}}}), "trainer", 0);
  CHECK(custom.task_type() == "trainer");

  // Local mode.
  ds::SimpleClusterResolver local(ds::ClusterSpec{}, "worker", 0);
  CHECK(local.is_chief());
  CHECK(local.worker_count() == 1);
  CHECK(local.master_address() == "");

  CHECK_THROWS_WITH_AS(ds::SimpleClusterResolver(spec, "worker", 3),
                       "SimpleClusterResolver: task_id 3 is out of range for job 'worker' with 3 tasks", ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SimpleClusterResolver(spec, "ps", 0),
                       "SimpleClusterResolver: task_type 'ps' has no job in the cluster spec (jobs: chief, worker)",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SimpleClusterResolver(spec, "worker", -1), "SimpleClusterResolver: task_id -1 is negative",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SimpleClusterResolver(spec, "", 0), "SimpleClusterResolver: task_type is empty", ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SimpleClusterResolver(spec, "chief", 0, "grpc", {{"GPU", -1}}),
                       doctest::Contains("num_accelerators['GPU'] is -1"), ds::ClusterConfigError);
}

TEST_CASE("id_in_cluster, is_chief and worker_count follow TF's multi_worker_util") {
  ds::ClusterSpec with_chief({{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1"}}, {"ps", {"p:1"}}});
  ds::ClusterSpec no_chief({{"worker", {"w0:1", "w1:1", "w2:1"}}});
  struct Row {
    const ds::ClusterSpec* spec;
    const char* type;
    int id;
    bool chief;
    int count;
    int id_in_cluster;
  };
  const Row rows[] = {
      {&with_chief, "chief", 0, true, 3, 0},  {&with_chief, "worker", 0, false, 3, 1}, {&with_chief, "worker", 1, false, 3, 2},
      {&no_chief, "worker", 0, true, 3, 0},   {&no_chief, "worker", 1, false, 3, 1},   {&no_chief, "worker", 2, false, 3, 2},
  };
  for (const auto& row : rows) {
    INFO(std::string(row.type), " ", row.id);
    ds::SimpleClusterResolver r(*row.spec, row.type, row.id);
    CHECK(r.is_chief() == row.chief);
    CHECK(r.worker_count() == row.count);
    CHECK(r.id_in_cluster() == row.id_in_cluster);
    // Global replica ids: contiguous across tasks.
    CHECK(r.global_replica_id(2, 0) == 2 * row.id_in_cluster);
    CHECK(r.global_replica_id(2, 1) == 2 * row.id_in_cluster + 1);
  }
  ds::SimpleClusterResolver r(no_chief, "worker", 1);
  CHECK(r.master_address() == "w0:1");
  CHECK_THROWS_WITH_AS(r.global_replica_id(2, 2),
                       "ClusterResolver::global_replica_id: local replica 2 is out of range for 2 local replicas", ds::InvalidArgument);
  CHECK_THROWS_AS(r.global_replica_id(0, 0), ds::InvalidArgument);

  ds::SimpleClusterResolver ps_only(ds::ClusterSpec({{"ps", {"p:1"}}}), "ps", 0);
  CHECK_THROWS_WITH_AS(ps_only.master_address(), doctest::Contains("has neither a chief nor worker 0"), ds::ClusterConfigError);
}

// ---------------------------------------------------------------------------------------------
// Slurm

TEST_CASE("Slurm hostlist expansion") {
  struct Row {
    const char* text;
    std::vector<std::string> hosts;
  };
  const Row rows[] = {
      {"node01", {"node01"}},
      {"node[01-03,07]", {"node01", "node02", "node03", "node07"}},
      {"a,b[1-2]", {"a", "b1", "b2"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"r[1-2]n[1-2]", {"r1n1", "r1n2", "r2n1", "r2n2"}},
      {"n[1-2]-ib", {"n1-ib", "n2-ib"}},
      {"a[1],b,c[3,5]", {"a1", "b", "c3", "c5"}},
      {"gpu-[0-1].cluster", {"gpu-0.cluster", "gpu-1.cluster"}},
      {"[1-2]", {"1", "2"}},
  };
  for (const auto& row : rows) {
    INFO(std::string(row.text));
    CHECK(ds::SlurmClusterResolver::expand_hostlist(row.text) == row.hosts);
  }
  CHECK(ds::SlurmClusterResolver::expand_hostlist("n[0-999]").size() == 1000);
}

TEST_CASE("Slurm hostlist errors name the list and the problem") {
  const BadCase cases[] = {
      {"empty", "", "hostlist '' is not a valid hostlist: it is empty"},
      {"unclosed", "node[1-3", "a '[' is never closed"},
      {"stray ]", "node1-3]", "']' at offset 7 has no matching '['"},
      {"nested", "n[[1]]", "'[' at offset 2 is nested"},
      {"empty element", "a,,b", "empty host name at offset 2"},
      {"trailing comma", "a,", "it ends with ','"},
      {"descending", "n[3-1]", "range item '3-1' in 'n[3-1]' goes down"},
      {"letters", "n[a-b]", "range item 'a-b' in 'n[a-b]' is not N or N-M"},
      {"empty range", "n[]", "has an empty range '[]'"},
      {"double dash", "n[1-2-3]", "range item '1-2-3'"},
      {"empty item", "n[1,]", "range item ''"},
      {"bad char", "bad host", "host name 'bad host' has the invalid character ' '"},
      {"too many", "n[0-99999999]", "names more than 1000000 hosts"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver::expand_hostlist(c.text), doctest::Contains(c.expected),
                         ds::ClusterConfigError);
  }
}

TEST_CASE("Slurm tasks-per-node expansion and its errors") {
  CHECK(ds::SlurmClusterResolver::expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(ds::SlurmClusterResolver::expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(ds::SlurmClusterResolver::expand_tasks_per_node("1,2,3") == std::vector<int>{1, 2, 3});
  CHECK(ds::SlurmClusterResolver::expand_tasks_per_node("1(x2),3(x1)") == std::vector<int>{1, 1, 3});
  const BadCase cases[] = {
      {"empty", "", "tasks-per-node list '' is not a valid tasks-per-node list: it is empty"},
      {"zero repeat", "2(x0)", "'2(x0)' is not N or N(xR) with R >= 1"},
      {"word", "x", "'x' is not N or N(xR)"},
      {"no x", "2(3)", "'2(3)' is not N or N(xR)"},
      {"unclosed", "2(x3", "'2(x3' is not N or N(xR)"},
      {"empty part", "2,,1", "'' is not N or N(xR)"},
      {"negative", "-1", "'-1' is not N or N(xR)"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver::expand_tasks_per_node(c.text), doctest::Contains(c.expected),
                         ds::ClusterConfigError);
  }
}

namespace {
ds::EnvVars slurm_env(const char* procid, const char* ntasks = "4", const char* nodelist = "node[01-02]",
                      const char* per_node = "2(x2)") {
  return {{"SLURM_PROCID", procid},
          {"SLURM_STEP_NUM_TASKS", ntasks},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_STEP_TASKS_PER_NODE", per_node}};
}
}  // namespace

TEST_CASE("SlurmClusterResolver: every task a worker, ports by position on the node") {
  ds::SlurmClusterResolver r({}, slurm_env("3"));
  CHECK(r.cluster_spec() == ds::ClusterSpec({{"worker", {"node01:8888", "node01:8889", "node02:8888", "node02:8889"}}}));
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 3);
  CHECK(r.rank() == 3);
  CHECK(r.rpc_layer() == "grpc");
  CHECK(r.hosts() == std::vector<std::string>{"node01", "node02"});
  CHECK(r.tasks_per_node() == std::vector<int>{2, 2});
  CHECK(r.num_accelerators().empty());
  CHECK(r.gpu_allocation() == "");
  CHECK_FALSE(r.is_chief());
  CHECK(r.worker_count() == 4);
  CHECK(r.id_in_cluster() == 3);
  CHECK(r.master_address() == "node01:8888");

  ds::SlurmClusterResolver r0({}, slurm_env("0"));
  CHECK(r0.is_chief());

  // Uneven nodes: "2(x3),1" over node[1-3],x.
  ds::SlurmClusterResolver uneven({}, slurm_env("6", "7", "node[1-3],x", "2(x3),1"));
  CHECK(uneven.cluster_spec().task_address("worker", 6) == "x:8888");
  CHECK(uneven.cluster_spec().task_address("worker", 5) == "node3:8889");
}

TEST_CASE("SlurmClusterResolver: jobs are filled in name order, with a port base") {
  ds::SlurmOptions options;
  options.jobs = {{"worker", 3}, {"ps", 1}};
  options.port_base = 9000;
  ds::SlurmClusterResolver ps(options, slurm_env("0"));
  CHECK(ps.task_type() == "ps");
  CHECK(ps.task_id() == 0);
  CHECK(ps.cluster_spec() == ds::ClusterSpec({{"ps", {"node01:9000"}}, {"worker", {"node01:9001", "node02:9000", "node02:9001"}}}));
  ds::SlurmClusterResolver w(options, slurm_env("2"));
  CHECK(w.task_type() == "worker");
  CHECK(w.task_id() == 1);
  CHECK(w.id_in_cluster() == 1);

  options.jobs = {{"chief", 1}, {"worker", 3}};
  ds::SlurmClusterResolver chief(options, slurm_env("0"));
  CHECK(chief.task_type() == "chief");
  CHECK(chief.is_chief());
  ds::SlurmClusterResolver last(options, slurm_env("3"));
  CHECK(last.task_id() == 2);
  CHECK(last.id_in_cluster() == 3);
  CHECK(last.worker_count() == 4);
  CHECK(last.master_address() == "node01:9000");
}

TEST_CASE("SlurmClusterResolver: GPUs per task from the step's GPU list") {
  auto env = slurm_env("1");
  env["SLURM_STEP_GPUS"] = "0,1,2,3";
  ds::SlurmClusterResolver r({}, env);
  CHECK(r.num_accelerators() == ds::AcceleratorCounts{{"GPU", 2}});
  CHECK(r.gpu_allocation() == "2,3");

  env.erase("SLURM_STEP_GPUS");
  env["SLURM_JOB_GPUS"] = "0-1";
  CHECK(ds::SlurmClusterResolver({}, env).num_accelerators() == ds::AcceleratorCounts{{"GPU", 1}});

  ds::SlurmOptions options;
  options.gpus_per_node = 8;
  options.gpus_per_task = 3;
  ds::SlurmClusterResolver explicit_gpus(options, env);
  CHECK(explicit_gpus.gpu_allocation() == "3,4,5");
  options.gpus_per_task = 5;
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver(options, env),
                       "SlurmClusterResolver: 5 GPUs per task for up to 2 tasks on a node need 10 GPUs but nodes have 8",
                       ds::ClusterConfigError);
  env["SLURM_JOB_GPUS"] = "0,x";
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver({}, env), doctest::Contains("SLURM_JOB_GPUS='0,x' is not a list of GPU ids"),
                       ds::ClusterConfigError);
}

TEST_CASE("SlurmClusterResolver errors name the variable") {
  struct EnvCase {
    const char* name;
    ds::EnvVars env;
    const char* expected;
  };
  auto without = [](const char* var) {
    auto env = slurm_env("0");
    env.erase(var);
    return env;
  };
  const EnvCase cases[] = {
      {"no PROCID", without("SLURM_PROCID"), "SlurmClusterResolver: environment variable SLURM_PROCID is not set (is this process a task of a Slurm step"},
      {"no NUM_TASKS", without("SLURM_STEP_NUM_TASKS"), "environment variable SLURM_STEP_NUM_TASKS is not set"},
      {"no NODELIST", without("SLURM_STEP_NODELIST"), "environment variable SLURM_STEP_NODELIST is not set"},
      {"no TASKS_PER_NODE", without("SLURM_STEP_TASKS_PER_NODE"), "environment variable SLURM_STEP_TASKS_PER_NODE is not set"},
      {"PROCID text", slurm_env("zero"), "SlurmClusterResolver: SLURM_PROCID='zero' is not an integer"},
      {"PROCID negative", slurm_env("-1"), "SlurmClusterResolver: SLURM_PROCID=-1 is out of range"},
      {"PROCID too big", slurm_env("4"), "SlurmClusterResolver: SLURM_PROCID=4 is out of range for SLURM_STEP_NUM_TASKS=4"},
      {"NUM_TASKS zero", slurm_env("0", "0"), "SLURM_STEP_NUM_TASKS=0 is out of range"},
      {"bad NODELIST", slurm_env("0", "4", "node[01-02"), "SlurmClusterResolver: SLURM_STEP_NODELIST 'node[01-02' is not a valid hostlist"},
      {"bad TASKS_PER_NODE", slurm_env("0", "4", "node[01-02]", "2(x)"),
       "SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE '2(x)' is not a valid tasks-per-node list"},
      {"node count", slurm_env("0", "4", "node[01-03]", "2(x2)"),
       "SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE='2(x2)' describes 2 nodes but SLURM_STEP_NODELIST='node[01-03]' has 3"},
      {"task count", slurm_env("0", "5", "node[01-02]", "2(x2)"),
       "SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE='2(x2)' adds up to 4 tasks but SLURM_STEP_NUM_TASKS=5"},
      {"node twice", slurm_env("0", "2", "a,a", "1(x2)"), "SlurmClusterResolver: worker[1] address 'a:8888' is already used by worker[0]"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver({}, c.env), doctest::Contains(c.expected), ds::ClusterConfigError);
  }

  ds::SlurmOptions options;
  options.jobs = {{"ps", 1}, {"worker", 2}};
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver(options, slurm_env("0")),
                       "SlurmClusterResolver: jobs ask for 3 tasks (ps: 1, worker: 2) but the Slurm step has SLURM_STEP_NUM_TASKS=4",
                       ds::ClusterConfigError);
  options.jobs = {{"ps", -1}, {"worker", 5}};
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver(options, slurm_env("0")), "SlurmClusterResolver: jobs['ps'] is -1, negative",
                       ds::ClusterConfigError);
  options.jobs = {{"bad-name", 4}};
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver(options, slurm_env("0")),
                       doctest::Contains("SlurmClusterResolver: job name 'bad-name' is not a valid name"), ds::ClusterConfigError);
  options.jobs = {};
  options.port_base = 65535;
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver(options, slurm_env("0")),
                       "SlurmClusterResolver: port_base 65535 with up to 2 tasks on a node gives ports outside [1, 65535]",
                       ds::ClusterConfigError);
  options.port_base = 0;
  CHECK_THROWS_AS(ds::SlurmClusterResolver(options, slurm_env("0")), ds::ClusterConfigError);
}

// ---------------------------------------------------------------------------------------------
// Launchers (mpirun, mpiexec, torchrun)

TEST_CASE("LauncherClusterResolver: Open MPI's variables with MASTER_ADDR/MASTER_PORT") {
  ds::EnvVars env{{"OMPI_COMM_WORLD_RANK", "2"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "10.0.0.1"},
                  {"MASTER_PORT", "29500"}};
  ds::LauncherClusterResolver r({}, env);
  CHECK(r.cluster_spec() ==
        ds::ClusterSpec({{"worker", {"10.0.0.1:29500", "10.0.0.1:29501", "10.0.0.1:29502", "10.0.0.1:29503"}}}));
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 2);
  CHECK(r.rank() == 2);
  CHECK(r.world_size() == 4);
  CHECK(r.local_rank() == 0);
  CHECK(r.rank_variable() == "OMPI_COMM_WORLD_RANK");
  CHECK(r.rpc_layer() == "grpc");
  CHECK_FALSE(r.is_chief());
  CHECK(r.worker_count() == 4);
  CHECK(r.id_in_cluster() == 2);
  CHECK(r.global_replica_id(2, 1) == 5);
  CHECK(r.master_address() == "10.0.0.1:29500");
  CHECK(ds::LauncherClusterResolver::detected(env));
  CHECK_FALSE(ds::LauncherClusterResolver::detected(ds::EnvVars{{"PATH", "/bin"}}));
}

TEST_CASE("LauncherClusterResolver: PMI and torchrun variables, option fallbacks, precedence") {
  ds::LauncherOptions options;
  options.master_addr = "127.0.0.1";
  options.master_port = 5000;
  ds::LauncherClusterResolver pmi(options, {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}});
  CHECK(pmi.is_chief());
  CHECK(pmi.rank_variable() == "PMI_RANK");
  CHECK(pmi.cluster_spec() == ds::ClusterSpec({{"worker", {"127.0.0.1:5000", "127.0.0.1:5001"}}}));

  // torchrun's agent listens on MASTER_PORT itself: offset the tasks' ports.
  ds::LauncherOptions torch;
  torch.port_offset = 1;
  ds::LauncherClusterResolver t(torch, {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "::1"},
                                        {"MASTER_PORT", "29500"}});
  CHECK(t.rank_variable() == "RANK");
  CHECK(t.local_rank() == 1);
  CHECK(t.cluster_spec().job_tasks("worker") == std::vector<std::string>{"[::1]:29501", "[::1]:29502"});
  CHECK(t.master_address() == "[::1]:29501");

  // The environment wins over the options; MPI's variables over torchrun's.
  ds::LauncherClusterResolver both(options, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"},
                                             {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
  CHECK(both.rank() == 1);
  CHECK(both.master_address() == "h:5000");
  CHECK_FALSE(both.local_rank().has_value());

  // One task and nowhere to meet: local mode.
  ds::LauncherClusterResolver single({}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK(single.cluster_spec().empty());
  CHECK(single.is_chief());
  CHECK(single.worker_count() == 1);
  CHECK(single.master_address() == "");
}

TEST_CASE("LauncherClusterResolver errors name the variable") {
  struct EnvCase {
    const char* name;
    ds::EnvVars env;
    const char* expected;
  };
  const EnvCase cases[] = {
      {"nothing", {{"PATH", "/bin"}}, "LauncherClusterResolver: no launcher environment: none of OMPI_COMM_WORLD_RANK"},
      {"no size", {{"OMPI_COMM_WORLD_RANK", "0"}}, "environment variable OMPI_COMM_WORLD_SIZE is not set"},
      {"rank text", {{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}, "LauncherClusterResolver: PMI_RANK='x' is not an integer"},
      {"rank too big", {{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "LauncherClusterResolver: RANK=4 is out of range for WORLD_SIZE=4"},
      {"size zero", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "LauncherClusterResolver: WORLD_SIZE=0 is out of range"},
      {"no MASTER_ADDR", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
       "LauncherClusterResolver: MASTER_ADDR is not set; 2 tasks (WORLD_SIZE=2) need the chief's address"},
      {"no MASTER_PORT", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "LauncherClusterResolver: MASTER_PORT is not set"},
      {"port text", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}},
       "LauncherClusterResolver: MASTER_PORT='http' is not an integer"},
      {"port range", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
       "LauncherClusterResolver: MASTER_PORT=70000 is out of range"},
      {"port overflow", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"}},
       "MASTER_PORT=65535 + port_offset 0 leaves no room for 2 tasks: port 65536 is past 65535"},
      {"bad addr", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "bad host"}, {"MASTER_PORT", "1"}},
       "LauncherClusterResolver: MASTER_ADDR='bad host' is not a host name or IP address"},
      {"bracketed addr", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "1"}},
       "MASTER_ADDR='[::1]' is not a host name"},
      {"local rank", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "-"}}, "LauncherClusterResolver: LOCAL_RANK='-' is not an integer"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    CHECK_THROWS_WITH_AS(ds::LauncherClusterResolver({}, c.env), doctest::Contains(c.expected), ds::ClusterConfigError);
  }
  ds::LauncherOptions bad_port;
  bad_port.master_addr = "h";
  bad_port.master_port = 0;
  CHECK_THROWS_WITH_AS(ds::LauncherClusterResolver(bad_port, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
                       "LauncherClusterResolver: master_port 0 is out of range [1, 65535]", ds::ClusterConfigError);
}

TEST_CASE("Resolvers are usable through the ClusterResolver base") {
  std::vector<std::unique_ptr<ds::ClusterResolver>> resolvers;
  resolvers.push_back(std::make_unique<ds::TFConfigClusterResolver>(
      R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})"));
  resolvers.push_back(std::make_unique<ds::SimpleClusterResolver>(ds::ClusterSpec({{"worker", {"a:1", "b:1"}}}), "worker", 1));
  resolvers.push_back(std::make_unique<ds::SlurmClusterResolver>(ds::SlurmOptions{}, slurm_env("1", "2", "a,b", "1(x2)")));
  resolvers.push_back(std::make_unique<ds::LauncherClusterResolver>(
      ds::LauncherOptions{}, ds::EnvVars{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}));
  for (const auto& r : resolvers) {
    CHECK(r->task_type() == "worker");
    CHECK(r->task_id() == 1);
    CHECK(r->worker_count() == 2);
    CHECK(r->id_in_cluster() == 1);
    CHECK_FALSE(r->is_chief());
    CHECK(r->master_address().rfind("a:", 0) == 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Bounds on what a resolver accepts (issue 20): hostlists that expand beyond a bound, hosts
// longer than 253 bytes, and IPv6 literals that are not addresses.

namespace {
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }
}  // namespace

TEST_CASE("Slurm hostlist: cross products expand in order, up to the bounds") {
  CHECK(ds::SlurmClusterResolver::expand_hostlist("a[1-2,5]b[08-10]c") ==
        std::vector<std::string>{"a1b08c", "a1b09c", "a1b10c", "a2b08c", "a2b09c", "a2b10c", "a5b08c", "a5b09c", "a5b10c"});
  CHECK(ds::SlurmClusterResolver::expand_hostlist("x[1][2][3]y,z") == std::vector<std::string>{"x123y", "z"});
  // 10^6 names of 7 bytes: exactly the name bound, 6.7 MiB of text.
  const auto million = ds::SlurmClusterResolver::expand_hostlist("n[0-9][0-9][0-9][0-9][0-9][0-9]");
  REQUIRE(million.size() == 1000000);
  CHECK(million.front() == "n000000");
  CHECK(million[123456] == "n123456");
  CHECK(million.back() == "n999999");
  // 253 bytes is a host name; the list that makes it is fine.
  const std::string longest(250, 'h');
  CHECK(ds::SlurmClusterResolver::expand_hostlist(longest + "[100-101]") ==
        std::vector<std::string>{longest + "100", longest + "101"});
}

TEST_CASE("Slurm hostlist: a list that expands beyond the bounds is refused before it is built") {
  const std::string pad(300, 'x');
  const BadCase cases[] = {
      // The issue's 418 bytes that took 17 s and 0.7 GB: a million names of 306 bytes.
      {"418 bytes, 300 MB of names", nullptr, "it expands to more than 16 MiB of host names"},
      {"1.2 KB: many elements", nullptr, "it names more than 1000000 hosts"},
      {"one element over the name bound", "n[0-9][0-9][0-9][0-9][0-9][0-9][0-9]", "names more than 1000000 hosts"},
      {"one range over the name bound", "n[0-999999,0-1]", "names more than 1000000 hosts"},
      {"name over 253 bytes", nullptr, "is longer than 253 bytes"},
  };
  const std::string texts[] = {
      pad + "[0-9][0-9][0-9][0-9][0-9][0-9]" + std::string(418 - 330, 'y'),
      [] {
        std::string t;
        for (int i = 0; i < 60; ++i) t += fmt::format("{}r{}[0-99][0-99][0-9]", i ? "," : "", i);  // 60 x 100000
        return t;
      }(),
      "", "", std::string(250, 'h') + "[998-1000]",
  };
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const std::string text = cases[i].text != nullptr ? std::string(cases[i].text) : texts[i];
    INFO(cases[i].name);
    CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver::expand_hostlist(text), contains(cases[i].expected),
                         ds::ClusterConfigError);
  }
  // The message quotes a long list by its start and its length, and names the long host.
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver::expand_hostlist(texts[0]),
                       contains(fmt::format("hostlist '{}...' (418 bytes) is not a valid hostlist", pad.substr(0, 64))),
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver::expand_hostlist(texts[4]),
                       contains(fmt::format("host '{}...' (254 bytes) is longer than 253 bytes", std::string(32, 'h'))),
                       ds::ClusterConfigError);
  // Through the resolver, with the variable's name.
  const std::string long_node(254, 'n');
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver({}, slurm_env("0", "2", long_node.c_str(), "2")),
                       contains("SlurmClusterResolver: SLURM_STEP_NODELIST"), ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::SlurmClusterResolver({}, slurm_env("0", "2", long_node.c_str(), "2")),
                       contains(fmt::format("host '{}...' (254 bytes) is longer than 253 bytes", std::string(32, 'n'))),
                       ds::ClusterConfigError);
}

TEST_CASE("every resolver refuses hosts over 253 bytes and IPv6 literals that are not addresses, naming the host") {
  const std::string h253(253, 'h'), h254(254, 'h');
  const std::string long_msg = fmt::format("host '{}...' (254 bytes) is longer than 253 bytes", std::string(32, 'h'));
  // cluster/address.hpp
  CHECK(ds::split_host_port(h253 + ":1") == ds::HostPort{h253, 1});
  CHECK(ds::split_host_port("[1:2:3:4:5:6:7:8]:1") == ds::HostPort{"1:2:3:4:5:6:7:8", 1});
  const BadCase cases[] = {
      {"[a:1]", "[a:1]:80", "address '[a:1]:80' has 'a:1' in brackets, which is not an IPv6 address"},
      {"[:]", "[:]:80", "address '[:]:80' has ':' in brackets, which is not an IPv6 address"},
      {"[:::]", "[:::]:80", "has ':::' in brackets, which is not an IPv6 address"},
      {"nine groups", "[1:2:3:4:5:6:7:8:9]:80", "has '1:2:3:4:5:6:7:8:9' in brackets"},
      {"bad IPv4 tail", "[::ffff:1.2.3.256]:80", "has '::ffff:1.2.3.256' in brackets"},
      {"empty zone", "[fe80::1%]:80", "has 'fe80::1%' in brackets"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    CHECK_THROWS_WITH_AS(ds::split_host_port(c.text), contains(c.expected), ds::ClusterConfigError);
  }
  CHECK_THROWS_WITH_AS(ds::split_host_port(h254 + ":1"), contains(long_msg), ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::split_host_port("[" + std::string(254, 'a') + "]:1"),
                       contains(fmt::format("host '{}...' (254 bytes) is longer than 253 bytes", std::string(32, 'a'))),
                       ds::ClusterConfigError);
  // TF_CONFIG (and ClusterSpec, SimpleClusterResolver: the same validation)
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(R"({"cluster": {"worker": ["[a:1]:2222"]}})"),
                       "TF_CONFIG: cluster.worker[0] address '[a:1]:2222' has 'a:1' in brackets, which is not an IPv6 address",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::TFConfigClusterResolver(fmt::format(R"({{"cluster": {{"worker": ["{}:2222"]}}}})", h254)),
                       contains(long_msg), ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::ClusterSpec({{"ps", {"[:]:1"}}}), contains("has ':' in brackets, which is not an IPv6 address"),
                       ds::ClusterConfigError);
  // The launcher's MASTER_ADDR
  for (const std::string& addr : {h254, std::string("a:1"), std::string(":")}) {
    INFO(addr.size());
    CHECK_THROWS_WITH_AS(ds::LauncherClusterResolver({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", addr}, {"MASTER_PORT", "1"}}),
                         contains(fmt::format("MASTER_ADDR='{}' is not a host name or IP address", addr)),
                         ds::ClusterConfigError);
  }
  // net/'s parser (the communicator's and the parameter server's addresses)
  using ds::net::parse_host_port;
  CHECK(parse_host_port(h253 + ":1").host == h253);
  CHECK(parse_host_port("[fe80::1%eth0]:1").host == "fe80::1%eth0");
  CHECK_THROWS_WITH_AS(parse_host_port("[a:1]:80"), "address '[a:1]:80': host 'a:1' is not an IPv6 address", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port("[:]:80"), "address '[:]:80': host ':' is not an IPv6 address", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port("a:1:80"), "address 'a:1:80' has an IPv6 host without brackets; write [host]:port",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port(h254 + ":1"), ("address: " + long_msg).c_str(), ds::InvalidArgument);
}
