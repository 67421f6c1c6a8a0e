package dynamodbdriver

import (
	"errors"
	"fmt"
	"net"
	"strings"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Error codes of DynamoDB answers that refuse the request itself: retrying
// cannot help, and they must never pass for an outage (which would let
// WithFailOpen run work unlocked).
var (
	invalidCodes = map[string]bool{
		"ValidationException":                      true,
		"ResourceNotFoundException":                true, // the table is gone
		"SerializationException":                   true,
		"UnknownOperationException":                true,
		"ItemCollectionSizeLimitExceededException": true,
		"InvalidEndpointException":                 true,
	}
	deniedCodes = map[string]bool{
		"AccessDeniedException":               true,
		"UnrecognizedClientException":         true,
		"InvalidSignatureException":           true,
		"IncompleteSignatureException":        true,
		"MissingAuthenticationTokenException": true,
		"InvalidClientTokenId":                true,
		"ExpiredTokenException":               true,
		"SignatureDoesNotMatch":               true,
	}
)

// storeErr wraps an error of op. DynamoDB's refusals of the request
// (invalidCodes) match driver.ErrInvalidArgument, its refusals of the
// credentials (deniedCodes) driver.ErrPermissionDenied; anything else
// (throttling, a 5xx, a network error, the end of ctx) is a store error,
// which the root package reports as driver.ErrUnavailable.
func storeErr(op string, err error) error {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		switch {
		case deniedCodes[code]:
			return fmt.Errorf("dynamodbdriver: %s: %w: %w", op, driver.ErrPermissionDenied, err)
		case invalidCodes[code]:
			return urlparam.Wrap("dynamodbdriver: "+op+": DynamoDB refused the request", err)
		}
	}
	if noCredentials(err) {
		return fmt.Errorf("dynamodbdriver: %s: %w: no usable AWS credentials (the SDK's chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, web identity, a container or instance role): %w", op, driver.ErrPermissionDenied, err)
	}
	return fmt.Errorf("dynamodbdriver: %s: %w", op, err)
}

// noCredentials reports whether err is the SDK's credential chain finding
// no credentials, for a reason other than a network failure (an instance
// metadata service that did not answer in time may answer next time).
func noCredentials(err error) bool {
	var nerr net.Error
	return strings.Contains(err.Error(), "get identity: ") && !errors.As(err, &nerr)
}

// notDynamoDB reports whether err says that the endpoint is not DynamoDB
// at all: an HTTP answer other than DynamoDB's (a 3xx or 4xx without a
// DynamoDB error code), or no HTTP (or TLS) answer from a server that did
// answer. Open calls that a configuration error, never an outage.
func notDynamoDB(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return false
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		if code := re.HTTPStatusCode(); code >= 300 && code < 500 && code != 429 {
			return true
		}
	}
	for _, s := range []string{"malformed HTTP", "does not look like a TLS handshake", "server gave HTTP response to HTTPS client"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
