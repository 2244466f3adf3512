//! TensorBoard's HParams view for a population: the experiment (which settings
//! vary, which metrics to compare) in the log directory's own event file, and one run
//! per agent whose session start records its settings and whose session end records how
//! it ended. The messages are the HParams plugin's (`tensorboard/plugins/hparams/
//! api.proto` and `plugin_data.proto`), written as summaries with the plugin's metadata
//! and a null tensor, as its `summary_v2.hparams_pb` writes them.

use std::collections::BTreeMap;

use crate::tensorboard::{
    Dim, PluginData, Summary, SummaryMetadata, SummaryValue, TensorProto, TensorShape,
};

/// `tensorboard.hparams.HParamsPluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginContent {
    #[prost(int32, tag = "1")]
    pub version: i32,
    #[prost(message, optional, tag = "2")]
    pub experiment: Option<Experiment>,
    #[prost(message, optional, tag = "3")]
    pub session_start_info: Option<SessionStart>,
    #[prost(message, optional, tag = "4")]
    pub session_end_info: Option<SessionEnd>,
}

/// `tensorboard.hparams.Experiment`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Experiment {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(double, tag = "3")]
    pub time_created_secs: f64,
    #[prost(message, repeated, tag = "4")]
    pub hparam_infos: Vec<HParamInfo>,
    #[prost(message, repeated, tag = "5")]
    pub metric_infos: Vec<MetricInfo>,
    #[prost(string, tag = "6")]
    pub name: String,
}

/// `tensorboard.hparams.HParamInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HParamInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub description: String,
    /// `DataType`: 1 string, 2 bool, 3 float64.
    #[prost(int32, tag = "4")]
    pub r#type: i32,
}

/// `tensorboard.hparams.MetricInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricInfo {
    #[prost(message, optional, tag = "1")]
    pub name: Option<MetricName>,
    #[prost(string, tag = "4")]
    pub description: String,
}

/// `tensorboard.hparams.MetricName`: a scalar tag (`group` is the run's subdirectory,
/// empty for the session's own).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricName {
    #[prost(string, tag = "1")]
    pub group: String,
    #[prost(string, tag = "2")]
    pub tag: String,
}

/// `tensorboard.hparams.SessionStartInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionStart {
    #[prost(btree_map = "string, message", tag = "1")]
    pub hparams: BTreeMap<String, ProtoValue>,
    /// Sessions with one group name are one configuration's seeds: the view averages
    /// their metrics.
    #[prost(string, tag = "4")]
    pub group_name: String,
    #[prost(double, tag = "5")]
    pub start_time_secs: f64,
}

/// `tensorboard.hparams.SessionEndInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionEnd {
    /// `Status`: 1 success, 2 failure, 3 running.
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(double, tag = "2")]
    pub end_time_secs: f64,
}

/// `google.protobuf.Value`, the kinds a setting takes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoValue {
    #[prost(double, optional, tag = "2")]
    pub number_value: Option<f64>,
    #[prost(string, optional, tag = "3")]
    pub string_value: Option<String>,
}

/// A setting's value as the HParams view shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum HValue {
    Number(f64),
    Text(String),
}

impl HValue {
    fn data_type(&self) -> i32 {
        match self {
            HValue::Text(_) => 1,
            HValue::Number(_) => 3,
        }
    }

    fn proto(&self) -> ProtoValue {
        match self {
            HValue::Number(x) => ProtoValue {
                number_value: Some(*x),
                string_value: None,
            },
            HValue::Text(s) => ProtoValue {
                number_value: None,
                string_value: Some(s.clone()),
            },
        }
    }
}

/// How a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Success = 1,
    Failure = 2,
}

const EXPERIMENT_TAG: &str = "_hparams_/experiment";
const SESSION_START_TAG: &str = "_hparams_/session_start_info";
const SESSION_END_TAG: &str = "_hparams_/session_end_info";

/// One summary value holding `content` as the plugin writes it.
fn summary(tag: &str, content: PluginContent) -> Summary {
    Summary {
        value: vec![SummaryValue {
            tag: tag.into(),
            simple_value: None,
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "hparams".into(),
                    content: prost::Message::encode_to_vec(&content),
                }),
            }),
            tensor: Some(TensorProto {
                dtype: 1,
                tensor_shape: Some(TensorShape {
                    dim: vec![Dim { size: 0 }],
                }),
            }),
        }],
    }
}

/// The experiment: the settings (`hparams`, with an example value each for its type)
/// and the metrics (scalar tags of the agents' runs, with a description) to compare.
pub fn experiment(
    name: &str,
    hparams: &[(&str, HValue)],
    metrics: &[(&str, &str)],
    time_created_secs: f64,
) -> Summary {
    summary(
        EXPERIMENT_TAG,
        PluginContent {
            experiment: Some(Experiment {
                name: name.into(),
                description: String::new(),
                time_created_secs,
                hparam_infos: hparams
                    .iter()
                    .map(|(n, v)| HParamInfo {
                        name: (*n).into(),
                        description: String::new(),
                        r#type: v.data_type(),
                    })
                    .collect(),
                metric_infos: metrics
                    .iter()
                    .map(|(tag, description)| MetricInfo {
                        name: Some(MetricName {
                            group: String::new(),
                            tag: (*tag).into(),
                        }),
                        description: (*description).into(),
                    })
                    .collect(),
            }),
            ..PluginContent::default()
        },
    )
}

/// A session's start: its settings, and the group (configuration) it belongs to.
pub fn session_start(hparams: &[(&str, HValue)], group: &str, start_time_secs: f64) -> Summary {
    summary(
        SESSION_START_TAG,
        PluginContent {
            session_start_info: Some(SessionStart {
                hparams: hparams
                    .iter()
                    .map(|(n, v)| ((*n).to_string(), v.proto()))
                    .collect(),
                group_name: group.into(),
                start_time_secs,
            }),
            ..PluginContent::default()
        },
    )
}

/// A session's end.
pub fn session_end(status: Status, end_time_secs: f64) -> Summary {
    summary(
        SESSION_END_TAG,
        PluginContent {
            session_end_info: Some(SessionEnd {
                status: status as i32,
                end_time_secs,
            }),
            ..PluginContent::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_null_tensor_is_the_plugins() {
        // tensorboard.plugins.hparams.metadata.NULL_TENSOR serialises to 080112021200.
        let s = session_end(Status::Success, 1.0);
        let bytes = prost::Message::encode_to_vec(s.value[0].tensor.as_ref().unwrap());
        assert_eq!(bytes, [0x08, 0x01, 0x12, 0x02, 0x12, 0x00]);
    }

    #[test]
    fn a_session_start_holds_each_setting_by_its_type() {
        let s = session_start(
            &[
                ("lr", HValue::Number(1e-3)),
                ("hidden", HValue::Text("64x64".into())),
            ],
            "config-3",
            5.0,
        );
        let v = &s.value[0];
        assert_eq!(v.tag, SESSION_START_TAG);
        let data = v.metadata.as_ref().unwrap().plugin_data.as_ref().unwrap();
        assert_eq!(data.plugin_name, "hparams");
        let content: PluginContent = prost::Message::decode(data.content.as_slice()).unwrap();
        let start = content.session_start_info.unwrap();
        assert_eq!(start.group_name, "config-3");
        assert_eq!(start.hparams["lr"].number_value, Some(1e-3));
        assert_eq!(
            start.hparams["hidden"].string_value.as_deref(),
            Some("64x64")
        );
    }
}
