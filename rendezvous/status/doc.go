// Package status is `gorun status`: a job's rendezvous as read from its
// keys without taking part in it (etcdstore.ReadStatus), as a Report whose
// JSON is the documented --json schema (Description), its text for people
// on one screen whatever the job's size (Report.WriteText), and the
// --watch loop that shows it again as it changes (Watch).
package status
