//! What can be checked of `envoy-examples/` without Docker or Envoy: the YAML parses, the
//! edgelimit configuration and the policies it mounts load, and every domain and descriptor
//! key Envoy sends exists in `policies/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use edgelimit::bootstrap::{load_options, BackendKind, ServerConfig};
use edgelimit::policy::PolicySet;
use serde::Deserialize;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// Just the parts of Envoy's bootstrap this test reads; everything else is ignored.
#[derive(Deserialize)]
struct Bootstrap {
    static_resources: StaticResources,
}
#[derive(Deserialize)]
struct StaticResources {
    listeners: Vec<Listener>,
    clusters: Vec<Cluster>,
}
#[derive(Deserialize)]
struct Cluster {
    name: String,
    #[serde(default)]
    typed_extension_protocol_options: BTreeMap<String, ProtocolOptions>,
}
#[derive(Deserialize)]
struct ProtocolOptions {
    explicit_http_config: Option<ExplicitHttp>,
}
#[derive(Deserialize)]
struct ExplicitHttp {
    http2_protocol_options: Option<serde::de::IgnoredAny>,
}
#[derive(Deserialize)]
struct Listener {
    name: String,
    filter_chains: Vec<FilterChain>,
}
#[derive(Deserialize)]
struct FilterChain {
    filters: Vec<NetworkFilter>,
}
#[derive(Deserialize)]
struct NetworkFilter {
    typed_config: Hcm,
}
#[derive(Deserialize)]
struct Hcm {
    route_config: RouteConfig,
    http_filters: Vec<HttpFilter>,
}
#[derive(Deserialize)]
struct RouteConfig {
    virtual_hosts: Vec<VirtualHost>,
}
#[derive(Deserialize)]
struct VirtualHost {
    routes: Vec<Route>,
}
#[derive(Deserialize)]
struct Route {
    route: Option<RouteAction>,
}
#[derive(Deserialize)]
struct RouteAction {
    #[serde(default)]
    rate_limits: Vec<RateLimit>,
}
#[derive(Deserialize)]
struct RateLimit {
    #[serde(default)]
    stage: u32,
    actions: Vec<Action>,
}
#[derive(Deserialize)]
struct Action {
    remote_address: Option<serde::de::IgnoredAny>,
    request_headers: Option<RequestHeaders>,
    generic_key: Option<GenericKey>,
}
#[derive(Deserialize)]
struct RequestHeaders {
    descriptor_key: String,
}
#[derive(Deserialize)]
struct GenericKey {
    descriptor_key: Option<String>,
}
#[derive(Deserialize)]
struct HttpFilter {
    name: String,
    typed_config: FilterConfig,
}
#[derive(Deserialize)]
struct FilterConfig {
    #[serde(rename = "@type")]
    kind: String,
    domain: Option<String>,
    #[serde(default)]
    stage: u32,
    rate_limit_service: Option<RateLimitService>,
}
#[derive(Deserialize)]
struct RateLimitService {
    transport_api_version: String,
    grpc_service: GrpcService,
}
#[derive(Deserialize)]
struct GrpcService {
    envoy_grpc: EnvoyGrpc,
}
#[derive(Deserialize)]
struct EnvoyGrpc {
    cluster_name: String,
}

#[derive(Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
}
#[derive(Deserialize)]
struct Service {
    #[serde(default)]
    volumes: Vec<String>,
}

fn action_key(action: &Action) -> String {
    match (
        &action.remote_address,
        &action.request_headers,
        &action.generic_key,
    ) {
        (Some(_), None, None) => "remote_address".to_owned(),
        (None, Some(h), None) => h.descriptor_key.clone(),
        (None, None, Some(g)) => g
            .descriptor_key
            .clone()
            .unwrap_or_else(|| "generic_key".into()),
        _ => panic!("an action must be exactly one of the kinds this test knows"),
    }
}

#[test]
fn every_example_yaml_file_parses() {
    let dir = root().join("envoy-examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            serde_saphyr::from_str::<serde::de::IgnoredAny>(&read(&path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert_eq!(
        seen, 4,
        "envoy.yaml, envoy-rlqs.yaml, edgelimit.yaml, docker-compose.yaml"
    );
}

#[test]
fn edgelimit_config_loads_and_its_mounted_policy_dir_loads() {
    let dir = root().join("envoy-examples");
    let config = ServerConfig::load(&dir.join("edgelimit.yaml")).expect("edgelimit.yaml");
    assert_eq!(config.backend_kind(), BackendKind::Redis);
    assert_eq!(config.listen.port(), 8081);
    assert_eq!(config.admin_listen.port(), 9090);

    // The container path is a volume: find what docker-compose mounts there.
    let compose: Compose =
        serde_saphyr::from_str(&read(&dir.join("docker-compose.yaml"))).expect("compose");
    let service = &compose.services["edgelimit"];
    let target = config.policy_dir.display().to_string();
    let host = service
        .volumes
        .iter()
        .find_map(|v| {
            let mut parts = v.split(':');
            let host = parts.next()?;
            (parts.next()? == target).then(|| host.to_owned())
        })
        .unwrap_or_else(|| panic!("docker-compose mounts nothing at {target}"));
    let set = PolicySet::load_dir(dir.join(host), &load_options(&config))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(set.has_domain("edge"));
}

#[test]
fn envoy_descriptors_use_domains_and_keys_that_policies_define() {
    let text = read(&root().join("envoy-examples/envoy.yaml"));
    let envoy: Bootstrap = serde_saphyr::from_str(&text).expect("envoy.yaml");
    let set = PolicySet::load_dir(root().join("policies"), &Default::default())
        .unwrap_or_else(|e| panic!("{e}"));

    let edgelimit = envoy
        .static_resources
        .clusters
        .iter()
        .find(|c| c.name == "edgelimit")
        .expect("edgelimit cluster");
    let http2 = edgelimit
        .typed_extension_protocol_options
        .values()
        .any(|o| {
            o.explicit_http_config
                .as_ref()
                .is_some_and(|h| h.http2_protocol_options.is_some())
        });
    assert!(http2, "gRPC needs HTTP/2 to edgelimit");

    let ingress = envoy
        .static_resources
        .listeners
        .iter()
        .find(|l| l.name == "ingress")
        .expect("ingress listener");
    let hcm = &ingress.filter_chains[0].filters[0].typed_config;
    let mut domain_of_stage = BTreeMap::new();
    for filter in &hcm.http_filters {
        let config = &filter.typed_config;
        if !config.kind.ends_with("ratelimit.v3.RateLimit") {
            continue;
        }
        let domain = config.domain.clone().expect("ratelimit filter domain");
        assert!(
            set.has_domain(&domain),
            "{}: domain {domain} not in policies/",
            filter.name
        );
        let service = config.rate_limit_service.as_ref().expect("service");
        assert_eq!(service.transport_api_version, "V3");
        assert_eq!(service.grpc_service.envoy_grpc.cluster_name, "edgelimit");
        assert!(
            domain_of_stage.insert(config.stage, domain).is_none(),
            "one domain per stage"
        );
    }
    assert_eq!(domain_of_stage.len(), 3);

    let mut checked = 0;
    for route in hcm
        .route_config
        .virtual_hosts
        .iter()
        .flat_map(|v| &v.routes)
        .filter_map(|r| r.route.as_ref())
    {
        for limit in &route.rate_limits {
            let domain = domain_of_stage
                .get(&limit.stage)
                .unwrap_or_else(|| panic!("no ratelimit filter for stage {}", limit.stage));
            for (level, action) in limit.actions.iter().enumerate() {
                let key = action_key(action);
                let known = set.rules().any(|r| {
                    r.display_path.starts_with(&format!("domain={domain} / "))
                        && r.display_path.split(" / ").nth(level + 1).is_some_and(|p| {
                            p == format!("key={key}") || p.starts_with(&format!("key={key},"))
                        })
                });
                assert!(
                    known,
                    "domain {domain} has no descriptor key {key} at level {level}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "{checked}");
}

/// `envoy-rlqs.yaml`: the `rate_limit_quota` filter reaches the edgelimit cluster over HTTP/2,
/// its domain is a policy domain, and every bucket its matchers build maps to a limit of
/// `policies/` through the server's own bucket mapping (a sample value for header inputs).
#[test]
fn rlqs_example_buckets_map_to_policy_limits() {
    use edgelimit::rlqs::bucket::{resolve, BucketKey, Resolution};
    use serde_json::Value;

    let text = read(&root().join("envoy-examples/envoy-rlqs.yaml"));
    let envoy: Value = serde_saphyr::from_str(&text).expect("envoy-rlqs.yaml");
    let set = PolicySet::load_dir(root().join("policies"), &Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let clusters = envoy["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let edgelimit = clusters
        .iter()
        .find(|c| c["name"] == "edgelimit")
        .expect("edgelimit cluster");
    assert!(
        edgelimit["typed_extension_protocol_options"]
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
            .get("http2_protocol_options")
            .is_some(),
        "gRPC needs HTTP/2 to edgelimit"
    );
    let listeners = envoy["static_resources"]["listeners"]
        .as_array()
        .expect("listeners");
    let filters: Vec<&Value> = listeners
        .iter()
        .flat_map(|l| l["filter_chains"].as_array().into_iter().flatten())
        .flat_map(|c| c["filters"].as_array().into_iter().flatten())
        .flat_map(|f| {
            f["typed_config"]["http_filters"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter(|f| f["name"] == "envoy.filters.http.rate_limit_quota")
        .collect();
    assert_eq!(filters.len(), 1, "one rate_limit_quota filter");
    let config = &filters[0]["typed_config"];
    assert!(config["@type"]
        .as_str()
        .is_some_and(|t| t.ends_with("rate_limit_quota.v3.RateLimitQuotaFilterConfig")));
    assert_eq!(
        config["rlqs_server"]["envoy_grpc"]["cluster_name"],
        "edgelimit"
    );
    let domain = config["domain"].as_str().expect("domain");
    assert!(set.has_domain(domain), "domain {domain} not in policies/");

    let hasher = edgelimit::subject::SubjectHasher::new(zeroize::Zeroizing::new(vec![1; 32]))
        .expect("hasher");
    let settings = edgelimit::rlqs::RlqsSettings::default();
    let matchers = config["bucket_matchers"]["matcher_list"]["matchers"]
        .as_array()
        .expect("matchers");
    assert!(matchers.len() >= 2);
    for matcher in matchers {
        let action = &matcher["on_match"]["action"]["typed_config"];
        assert!(action["reporting_interval"].is_string(), "{action}");
        assert_eq!(
            action["expired_assignment_behavior"]["fallback_rate_limit"]["blanket_rule"],
            "DENY_ALL",
            "an expired assignment fails closed"
        );
        let builder = action["bucket_id_builder"]["bucket_id_builder"]
            .as_object()
            .expect("bucket_id_builder");
        let entries: std::collections::HashMap<String, String> = builder
            .iter()
            .map(|(key, value)| {
                let value = value["string_value"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| "sample-value".to_owned());
                (key.clone(), value)
            })
            .collect();
        let key = BucketKey::new(entries.iter(), &settings).expect("a valid bucket id");
        let resolution = resolve(&set, domain, &key, &hasher);
        assert!(
            matches!(&resolution, Resolution::Limited { targets, .. } if !targets.is_empty()),
            "bucket {entries:?} maps to no limit of domain {domain}: {resolution:?}"
        );
    }
}
